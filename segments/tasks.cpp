// The segment tasks (verify, writes, sample) and the registry of sharded campaign tasks.
#include "segments/tasks.h"

#include <charconv>
#include <cstdio>
#include <map>

#include <fmt/format.h>

#include "core/exit_status.h"
#include "core/messages.h"
#include "core/page_walker.h"
#include "replay/replay_setup.h"
#include "segments/store.h"

namespace deja {
namespace {

std::string value_hex(std::span<const uint8_t> bytes) {
  std::string s = "0x";
  for (size_t i = bytes.size(); i-- > 0;) s += fmt::format("{:02x}", bytes[i]);
  return s;
}

std::string bytes_hex(std::span<const uint8_t> bytes) {
  std::string s;
  for (uint8_t b : bytes) s += fmt::format("{:02x}", b);
  return s;
}

// Guest-virtual memory now; false where it is not mapped.
bool read_virtual(Session& session, uint64_t address, std::vector<uint8_t>& out) {
  auto st = session.machine().backend().get_state();
  std::fill(out.begin(), out.end(), uint8_t{0});
  return st && read_gva(*st, session.machine().memory(), address, out) == out.size();
}

// Records are JSON objects; printed as a JSON array, or one line each.
void print_records(const std::vector<std::string>& records, bool json, const std::function<std::string(size_t)>& text) {
  if (json) {
    std::printf("[");
    for (size_t i = 0; i < records.size(); ++i) std::printf("%s\n  %s", i ? "," : "", records[i].c_str());
    std::printf("%s]\n", records.empty() ? "" : "\n");
    return;
  }
  for (size_t i = 0; i < records.size(); ++i) std::printf("%s\n", text(i).c_str());
}

// A record keeps its text line after the JSON object, separated by a newline, so that one list serves both outputs.
std::string record(const std::string& json, const std::string& text) { return json + "\n" + text; }
std::string json_of(const std::string& r) { return r.substr(0, r.find('\n')); }
std::string text_of(const std::string& r) {
  const size_t nl = r.find('\n');
  return nl == std::string::npos ? r : r.substr(nl + 1);
}

class VerifyTask : public SegmentTask {
 public:
  Result<StopReason> run(Session& session, const StopRequest& end, std::vector<std::string>&) override {
    return session.run_until(end);
  }
  void print(const std::vector<std::string>&, bool) const override {}
};

class WritesTask : public SegmentTask {
 public:
  WritesTask(std::string spec, uint64_t address, uint64_t length)
      : spec_(std::move(spec)), address_(address), length_(length) {}
  bool needs_steps() const override { return true; }
  Result<StopReason> run(Session& session, const StopRequest& end, std::vector<std::string>& records) override {
    std::vector<uint8_t> before(length_), after(length_);
    bool mapped_before = read_virtual(session, address_, before);
    for (;;) {
      StopRequest stop = end;
      stop.watchpoints = {Watchpoint{address_, length_, WatchKind::kWrite}};
      auto r = session.run_until(stop);
      if (!r || r->kind != StopReason::Kind::kWatchpoint) return r;
      const bool mapped_after = read_virtual(session, address_, after);
      const CheckpointPosition at = session.checkpoint_position();
      const std::string old_text = mapped_before ? value_hex(before) : "unmapped";
      const std::string new_text = mapped_after ? value_hex(after) : "unmapped";
      // The write happened in the step that just ended: its point is the one before it.
      records.push_back(record(
          fmt::format("{{\"step\": {}, \"instructions\": {}, \"events\": {}, \"rip\": \"{:#x}\", \"address\": \"{:#x}\", "
                      "\"old\": \"{}\", \"new\": \"{}\"}}",
                      at.steps - 1, at.instructions, at.events, r->watch_rip, r->watch_address, old_text, new_text),
          fmt::format("step {}  rip {:#x}  {:#x}: {} -> {}", at.steps - 1, r->watch_rip, r->watch_address, old_text,
                      new_text)));
      before = after;
      mapped_before = mapped_after;
    }
  }
  void print(const std::vector<std::string>& records, bool json) const override {
    std::vector<std::string> jsons;
    for (const auto& r : records) jsons.push_back(json_of(r));
    print_records(jsons, json, [&](size_t i) { return text_of(records[i]); });
    if (!json) say("{} writes to {}", records.size(), spec_);
  }

 private:
  std::string spec_;
  uint64_t address_, length_;
};

class SampleTask : public SegmentTask {
 public:
  SampleTask(uint64_t every, uint64_t address, uint64_t length) : every_(every), address_(address), length_(length) {}
  bool needs_steps() const override { return true; }
  Result<StopReason> run(Session& session, const StopRequest& end, std::vector<std::string>& records) override {
    const uint64_t start = session.checkpoint_position().steps;
    uint64_t next = std::max<uint64_t>(1, (start + every_ - 1) / every_) * every_;
    for (;;) {
      StopRequest stop = end;
      const bool before_end = !end.at_step || next < *end.at_step;
      if (before_end) stop.at_step = next;
      auto r = session.run_until(stop);
      if (!r || r->kind != StopReason::Kind::kStep || !before_end) return r;
      const CheckpointPosition at = session.checkpoint_position();
      if (at.steps != next) return r;
      auto st = session.machine().backend().get_state();
      if (!st) return std::unexpected(st.error());
      std::string json = registers_json(*st, at);
      std::string text = fmt::format("steps {} instructions {} events {} rip {:#x}", at.steps, at.instructions,
                                     at.events, st->rip);
      if (length_) {
        std::vector<uint8_t> bytes(length_);
        const bool mapped = read_virtual(session, address_, bytes);
        const std::string shown = mapped ? bytes_hex(bytes) : "unmapped";
        json.pop_back();
        json += fmt::format(", \"address\": \"{:#x}\", \"bytes\": \"{}\"}}", address_, shown);
        text += fmt::format("  {:#x}: {}", address_, shown);
      }
      records.push_back(record(json, text));
      next += every_;
    }
  }
  void print(const std::vector<std::string>& records, bool json) const override {
    std::vector<std::string> jsons;
    for (const auto& r : records) jsons.push_back(json_of(r));
    print_records(jsons, json, [&](size_t i) { return text_of(records[i]); });
  }

 private:
  uint64_t every_, address_, length_;
};

// The smallest real campaign, so the executors can be tried on shards before there are bigger ones: "sha256" hashes
// the files its arguments name, shard I of N every N-th from the I-th, and the merge prints them as sha256sum does.
class FileHashShards : public ShardTask {
 public:
  Result<int> run_shard(std::span<const std::string> files, uint32_t index, uint32_t count,
                        std::vector<std::string>& records) override {
    for (size_t i = index; i < files.size(); i += count) {
      auto sha = file_sha256(files[i]);
      if (!sha) return std::unexpected(sha.error());
      records.push_back(fmt::format("{{\"file\": {}, \"sha256\": \"{}\"}}", i, bytes_hex(*sha)));
    }
    return 0;
  }
  int merge(std::span<const std::string> files, const std::vector<std::vector<std::string>>& records) override {
    std::map<size_t, std::string> lines;
    for (const auto& shard : records) {
      for (const auto& record : shard) {
        size_t i = 0;
        char hash[65] = {};
        if (std::sscanf(record.c_str(), "{\"file\": %zu, \"sha256\": \"%64[0-9a-f]\"}", &i, hash) == 2 &&
            i < files.size()) {
          lines[i] = fmt::format("{}  {}", hash, files[i]);
        }
      }
    }
    for (const auto& [i, line] : lines) std::printf("%s\n", line.c_str());
    if (lines.size() == files.size()) return 0;
    say("sha256: {} of {} files hashed", lines.size(), files.size());
    return exit_status::kHostFailure;
  }
};

std::map<std::string, ShardTaskFactory>& shard_tasks() {
  static std::map<std::string, ShardTaskFactory> tasks{
      {"sha256", [] { return std::make_unique<FileHashShards>(); }}};
  return tasks;
}

}  // namespace

std::vector<std::pair<const char*, uint64_t>> named_registers(const CpuState& st) {
  static const char* const kNames[] = {"rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
                                       "r8",  "r9",  "r10", "r11", "r12", "r13", "r14", "r15"};
  std::vector<std::pair<const char*, uint64_t>> regs;
  for (int i = 0; i < kGprCount; ++i) regs.emplace_back(kNames[i], st.gpr[i]);
  for (auto n : {std::pair<const char*, uint64_t>{"rip", st.rip}, {"rflags", st.rflags}, {"cs", st.cs.selector},
                 {"ss", st.ss.selector}, {"ds", st.ds.selector}, {"es", st.es.selector}, {"fs", st.fs.selector},
                 {"gs", st.gs.selector}, {"fs_base", st.fs.base}, {"gs_base", st.gs.base}, {"cr0", st.cr0},
                 {"cr2", st.cr2}, {"cr3", st.cr3}, {"cr4", st.cr4}, {"efer", st.efer}}) {
    regs.push_back(n);
  }
  return regs;
}

std::string registers_json(const CpuState& st, const CheckpointPosition& at) {
  std::string out = fmt::format("{{\"steps\": {}, \"instructions\": {}, \"events\": {}, \"registers\": {{", at.steps,
                                at.instructions, at.events);
  const auto regs = named_registers(st);
  for (size_t i = 0; i < regs.size(); ++i) out += fmt::format("{}\"{}\": \"{:#x}\"", i ? ", " : "", regs[i].first, regs[i].second);
  return out + "}}";
}

Result<std::unique_ptr<SegmentTask>> make_segment_task(const std::string& spec) {
  if (spec == "verify") return std::make_unique<VerifyTask>();
  if (spec.starts_with("writes:")) {
    auto range = parse_range(spec.substr(7), 4096);
    if (!range) return fail(ErrorKind::kInvalidArgument, "task {}: {}", spec, range.error().message);
    return std::make_unique<WritesTask>(spec.substr(7), range->first, range->second);
  }
  if (spec.starts_with("sample:")) {
    const std::string rest = spec.substr(7);
    const size_t colon = rest.find(':');
    uint64_t every = 0;
    const std::string count = rest.substr(0, colon);
    auto [end, ec] = std::from_chars(count.data(), count.data() + count.size(), every);
    if (ec != std::errc() || end != count.data() + count.size() || every == 0) {
      return fail(ErrorKind::kInvalidArgument, "task {}: expected sample:N or sample:N:ADDR:LEN (N steps apart)", spec);
    }
    std::pair<uint64_t, uint64_t> range{0, 0};
    if (colon != std::string::npos) {
      auto parsed = parse_range(rest.substr(colon + 1), 4096);
      if (!parsed) return fail(ErrorKind::kInvalidArgument, "task {}: {}", spec, parsed.error().message);
      range = *parsed;
    }
    return std::make_unique<SampleTask>(every, range.first, range.second);
  }
  return fail(ErrorKind::kInvalidArgument, "unknown task '{}': verify, writes:ADDR:LEN, sample:N[:ADDR:LEN]", spec);
}

void register_shard_task(const std::string& kind, ShardTaskFactory factory) { shard_tasks()[kind] = std::move(factory); }

std::unique_ptr<ShardTask> make_shard_task(const std::string& kind) {
  auto it = shard_tasks().find(kind);
  return it == shard_tasks().end() ? nullptr : it->second();
}

}  // namespace deja
