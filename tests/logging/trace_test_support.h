// Shared fixtures for the trace tests: a private temp directory, sample headers/events and whole-file helpers.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include "logging/trace_inspect.h"
#include "logging/trace_reader.h"
#include "logging/trace_writer.h"

namespace deja::testing {

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "deja-logging-XXXXXX").string();
    char* made = ::mkdtemp(pattern.data());
    EXPECT_NE(made, nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline trace::Header sample_header() {
  trace::Header h;
  h.set_cpu_model_version(1);
  h.set_device_model_version(1);
  h.set_build_id("test-build-1234");
  h.set_deja_version("0.1.0");
  h.set_host("Linux testhost 6.1 x86_64, Test CPU");
  h.set_start_unix_ns(1764408492123456789);
  auto* input = h.add_inputs();
  input->set_role("image");
  input->set_path("guests/hello.elf");
  input->set_sha256(std::string(32, '\xab'));
  input->set_size(12345);
  auto* c = h.mutable_config();
  c->set_memory_bytes(256ull << 20);
  c->set_vcpus(1);
  c->set_backend("interp");
  c->set_progress_mode("exact");
  c->set_cmdline("console=ttyS0");
  return h;
}

inline trace::Coordinate coordinate(uint64_t branches, uint64_t rip) {
  trace::Coordinate c;
  c.set_vcpu(0);
  c.set_branches(branches);
  c.set_rip(rip);
  c.set_rcx(branches * 3);
  c.set_gpr_digest(branches * 0x9e3779b97f4a7c15ull);
  c.set_guest_exits(branches / 7);
  return c;
}

// A deterministic mix of every event kind, ending with End, so chunks hold varied sizes and coordinates.
inline std::vector<trace::Event> sample_events(size_t count, uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::vector<trace::Event> events;
  for (size_t i = 0; i + 1 < count; ++i) {
    trace::Event e;
    e.set_vcpu(static_cast<uint32_t>(rng() % 2));
    uint64_t r = rng();
    switch (i % 9) {
      case 0: {
        auto* p = e.mutable_port_read();
        p->set_port(0x3f8 + static_cast<uint32_t>(r % 8));
        p->set_size(1);
        p->set_value(r & 0xff);
        p->set_rip(0x100000 + i);
        break;
      }
      case 1: {
        auto* m = e.mutable_mmio_read();
        m->set_address(0xfee00000 + (r % 0x400));
        m->set_size(4);
        m->set_value(r);
        m->set_rip(0x100000 + i);
        break;
      }
      case 2: e.mutable_clock()->set_now_ns(i * 1000); break;
      case 3: {
        auto* a = e.mutable_async();
        *a->mutable_at() = coordinate(i * 10, 0x100000 + i);
        a->set_now_ns(i * 1000);
        if (r % 2) a->set_serial_input(std::string(1 + r % 5, 'k'));
        break;
      }
      case 4: {
        auto* it = e.mutable_interrupt();
        *it->mutable_at() = coordinate(i * 10 + 1, 0x200000 + i);
        it->set_vector(0x20 + static_cast<uint32_t>(r % 16));
        break;
      }
      case 5: e.mutable_rdtsc()->set_value(r); e.mutable_rdtsc()->set_rip(i); break;
      case 6: e.mutable_rdrand()->set_value(r); e.mutable_rdrand()->set_ok(true); break;
      case 7: {
        auto* m = e.mutable_msr_read();
        m->set_msr(0x10);
        m->set_value(r);
        break;
      }
      case 8: e.mutable_serial_output()->set_data("line " + std::to_string(i) + "\n"); break;
    }
    events.push_back(std::move(e));
  }
  trace::Event end;
  auto* d = end.mutable_end();
  *d->mutable_at() = coordinate(count * 10, 0x1234);
  d->set_exit_status(0);
  d->set_instructions(count * 100);
  d->set_reason("guest wrote SUCCESS and halted");
  d->set_digest(std::string(32, '\x5a'));
  events.push_back(std::move(end));
  return events;
}

inline trace::Footer sample_footer(size_t count) {
  trace::Footer f;
  f.set_instructions(count * 100);
  f.set_branches(count * 10);
  f.set_wall_ns(1500000000);
  f.set_exit_status(0);
  f.set_final_digest(std::string(32, '\x5a'));
  return f;
}

// Writes a complete trace; returns its footer as the writer filled it (chunk offsets for damage tests).
inline trace::Footer write_trace(const std::string& path, const std::vector<trace::Event>& events,
                                 size_t chunk_bytes = 256) {
  auto writer = TraceWriter::create(path, sample_header());
  EXPECT_TRUE(writer.has_value()) << writer.error().message;
  (*writer)->set_chunk_bytes(chunk_bytes);
  for (const auto& e : events) {
    auto r = (*writer)->append(e);
    EXPECT_TRUE(r.has_value()) << r.error().message;
  }
  auto r = (*writer)->finish(sample_footer(events.size()));
  EXPECT_TRUE(r.has_value()) << r.error().message;
  // Re-read the footer the way any reader would, so tests see exactly what is on disk.
  auto reader = TraceReader::open(path);
  EXPECT_TRUE(reader.has_value());
  while (true) {
    auto e = (*reader)->next();
    EXPECT_TRUE(e.has_value()) << e.error().message;
    if (!e || !*e) break;
  }
  EXPECT_NE((*reader)->footer(), nullptr);
  return (*reader)->footer() ? *(*reader)->footer() : trace::Footer{};
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  // A fresh inode each time: ext4 flushes a file truncated and rewritten in place on close, which makes
  // thousands of rewrites crawl on a busy disk.
  ::unlink(path.c_str());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Everything a reader yields: the events, plus how it ended.
struct ReadOutcome {
  bool opened = false;
  bool error = false;
  std::string message;
  std::vector<trace::Event> events;
  bool complete = false;
  bool truncated = false;
};

inline ReadOutcome read_all(const std::string& path, size_t max_events = 1000000) {
  ReadOutcome out;
  auto reader = TraceReader::open(path);
  if (!reader) {
    out.error = true;
    out.message = reader.error().message;
    return out;
  }
  out.opened = true;
  while (out.events.size() <= max_events) {
    auto e = (*reader)->next();
    if (!e) {
      out.error = true;
      out.message = e.error().message;
      break;
    }
    if (!*e) break;
    out.events.push_back(std::move(**e));
  }
  out.complete = (*reader)->complete();
  out.truncated = (*reader)->truncated();
  if (!out.error) out.message = (*reader)->end_description();
  return out;
}

// What inspect_trace prints; its result goes to `result`, or is expected to succeed.
inline std::string capture(const std::string& path, const InspectOptions& options, Result<>* result = nullptr) {
  char* buffer = nullptr;
  size_t size = 0;
  std::FILE* out = ::open_memstream(&buffer, &size);
  Result<> r = inspect_trace(path, options, out);
  std::fclose(out);
  std::string text(buffer, size);
  std::free(buffer);
  if (result) *result = r;
  else EXPECT_TRUE(r.has_value()) << r.error().message;
  return text;
}

inline bool same_event(const trace::Event& a, const trace::Event& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

}  // namespace deja::testing
