// Engine implementation: each choke point records in record mode, answers from the trace (and checks) in replay.
#include "replay/engine.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "logging/trace_inspect.h"
#include "core/cpu_model.h"

namespace deja {

namespace {
constexpr size_t kRecentEvents = 8;

uint64_t ns_to_tsc(uint64_t ns) {
  return uint64_t((unsigned __int128)ns * CpuModel::kTscHz / 1'000'000'000u);
}
}  // namespace

std::string_view progress_mode_name(ProgressMode mode) {
  return mode == ProgressMode::kExact ? "exact" : "exit-sync";
}

trace::Coordinate to_proto(const Position& p) {
  trace::Coordinate c;
  c.set_vcpu(p.at.vcpu);
  c.set_branches(p.at.branches);
  c.set_rip(p.at.rip);
  c.set_rcx(p.at.rcx);
  c.set_gpr_digest(p.gpr_digest);
  c.set_guest_exits(p.guest_exits);
  return c;
}

Engine::Engine(Mode mode, ProgressMode progress) : mode_(mode), progress_(progress) {}
Engine::~Engine() = default;

uint64_t Engine::host_now_ns() {
  if (simulated_) return derived_now_ns();
  uint64_t t = host_clock_.elapsed_ns();
  if (t < last_now_) t = last_now_;  // virtual time never runs backwards
  last_now_ = t;
  return t;
}

uint64_t Engine::idle_now_ns(std::optional<uint64_t> deadline, std::optional<uint64_t> network_ns) {
  const uint64_t running = running_now_ns();
  // Simulated: the wait lasts until the next deadline is met (or the network's next work, whose latency is drawn
  // already), however long that takes the host.
  if (simulated_) {
    const uint64_t until = std::min(deadline ? timer_due_ns(*deadline) : UINT64_MAX, network_ns.value_or(UINT64_MAX));
    return until == UINT64_MAX ? running : std::max(running, until);
  }
  const uint64_t elapsed = host_clock_.elapsed_ns();
  uint64_t host = elapsed > idle_lag_ns_ ? elapsed - idle_lag_ns_ : 0;
  if (deadline && host > *deadline + kCatchUpNs) {
    idle_lag_ns_ += host - *deadline;
    host = *deadline;
  }
  return std::max(running, host);
}

Result<> Engine::simulate_host(SimulatedHost host) {
  if (!derived_) {
    return fail(ErrorKind::kUnsupported, "a simulated host needs derived time (--backend interp, exact progress)");
  }
  for (const auto& network : networks_) {
    if (!network->restricted()) {
      return fail(ErrorKind::kUnsupported, "a simulated host's network is restricted (nothing of the host's: restrict=on)");
    }
  }
  simulated_ = host;
  simulated_random_.set_state(host.seed ^ 0x656e74726f7079ull);  // ("entropy": apart from the schedule's draws)
  links_.resize(networks_.size());
  return {};
}

uint64_t Engine::timer_due_ns(uint64_t deadline) const {
  if (!simulated_ || simulated_->max_timer_delay_ns == 0) return deadline;
  // Keyed by the deadline and the last asynchronous event (stable until the deadline is met): each completion and
  // timer gets its own delay, a virtio request "due now" (deadline 0) included.
  const uint64_t key = seeded_hash(deadline, derived_ ? derived_->anchor_instructions : 0);
  return deadline + seeded_hash(simulated_->seed, key) % (simulated_->max_timer_delay_ns + 1);
}

uint64_t Engine::host_random(bool* ok) {
  if (!simulated_) return host_random64(ok);
  *ok = true;
  return simulated_random_.next();
}

void Engine::remember(const trace::Event& e) {
  recent_.push_back(fmt::format("#{} {}", events_, describe_event(e)));
  if (recent_.size() > kRecentEvents) recent_.pop_front();
}

void Engine::flush_output() {
  if (pending_output_.empty() || !writer_) return;
  trace::Event e;
  e.mutable_serial_output()->set_data(pending_output_.data(), pending_output_.size());
  pending_output_.clear();
  if (auto r = writer_->append(e); !r && write_error_.empty()) write_error_ = r.error().message;
}

// Serial output is logged in blocks (at 4 KiB, heartbeats and the end), not before every event: replay
// compares it as a byte stream, so its exact place among the other events does not matter, and a
// per-character event would double the size of an output-heavy trace.
void Engine::append(trace::Event event) {
  if (vcpu_ != 0) event.set_vcpu(vcpu_);
  remember(event);
  ++events_;
  if (writer_) {
    if (auto r = writer_->append(event); !r && write_error_.empty()) write_error_ = r.error().message;
  }
}


std::optional<trace::Event> Engine::next_raw() {
  if (history_pos_ < history_.size()) return history_[history_pos_++];
  auto next = reader_->next();
  if (!next) {
    trace_error_ = next.error().message;
    exhausted_ = true;
    return std::nullopt;
  }
  if (!*next) {
    exhausted_ = true;
    return std::nullopt;
  }
  if (rewind_) {
    history_.push_back(**next);
    history_pos_ = history_.size();
  }
  return std::move(*next);
}

const trace::Event* Engine::peek() {
  while (!lookahead_ && !exhausted_ && reader_) {
    auto next = next_raw();
    if (!next) break;
    if (next->kind_case() == trace::Event::kSerialOutput) {
      output_.add(StreamMatch::kRecorded, next->serial_output().data());
      match_output();
      continue;
    }
    if (next->kind_case() == trace::Event::kDiskIo) continue;  // for inspect: nothing to replay or check
    lookahead_ = std::move(*next);
  }
  return lookahead_ ? &*lookahead_ : nullptr;
}

const trace::Event* Engine::expect(trace::Event::KindCase kind, const std::string& what) {
  if (divergence_) return nullptr;
  const trace::Event* e = peek();
  if (!e) return nullptr;  // exhausted: the session reports where the trace ends
  if (e->kind_case() != kind) {
    diverge(fmt::format("the guest did: {}", what), describe_event(*e), what);
    return nullptr;
  }
  if (e->vcpu() != vcpu_) {
    diverge(fmt::format("vCPU {} did: {}", vcpu_, what), fmt::format("{} on vCPU {}", describe_event(*e), e->vcpu()),
            what);
    return nullptr;
  }
  current_ = std::move(*lookahead_);
  lookahead_.reset();
  remember(current_);
  ++events_;
  return &current_;
}

void Engine::diverge(const std::string& what, const std::string& expected, const std::string& actual) {
  if (divergence_) return;
  std::string report = fmt::format("replay diverged at event {}: {}\n", events_, what);
  if (where_) {
    Position p = where_();
    report += fmt::format("  coordinate: vcpu {} branches {} rip {:#x} rcx {:#x} gpr-digest {:016x} guest-exits {}\n",
                          p.at.vcpu, p.at.branches, p.at.rip, p.at.rcx, p.gpr_digest, p.guest_exits);
  }
  report += fmt::format("  recorded: {}\n  replayed: {}\n", expected, actual);
  if (!recent_.empty()) {
    report += "  preceding events:\n";
    for (const auto& line : recent_) report += "    " + line + "\n";
  }
  divergence_ = Divergence{events_, report};
}

uint64_t Engine::now_ns() {
  if (frozen_now_) return *frozen_now_;
  if (derived_) return derived_now_ns();
  switch (mode_) {
    case Mode::kRun:
      return host_now_ns();
    case Mode::kRecord: {
      uint64_t t = host_now_ns();
      trace::Event e;
      e.mutable_clock()->set_now_ns(t);
      append(std::move(e));
      return t;
    }
    case Mode::kReplay:
      if (const auto* e = expect(trace::Event::kClock, "a device read the clock")) last_now_ = e->clock().now_ns();
      return last_now_;
  }
  return last_now_;
}

uint64_t Engine::port_read(uint16_t port, unsigned size, uint64_t device_value, uint64_t rip) {
  count_device_read();
  if (mode_ == Mode::kRecord) {
    trace::Event e;
    auto* r = e.mutable_port_read();
    r->set_port(port);
    r->set_size(size);
    r->set_value(device_value);
    r->set_rip(rip);
    append(std::move(e));
  } else if (mode_ == Mode::kReplay) {
    std::string what = fmt::format("port_read port={:#x} size={} value={:#x} rip={:#x}", port, size, device_value, rip);
    if (const auto* e = expect(trace::Event::kPortRead, what)) {
      const auto& r = e->port_read();
      if (r.port() != port || r.size() != size || r.rip() != rip || r.value() != device_value) {
        diverge("port read differs", describe_event(*e), what);
      }
      return r.value();
    }
  }
  return device_value;
}

uint64_t Engine::mmio_read(uint64_t address, unsigned size, uint64_t device_value, uint64_t rip) {
  count_device_read();
  if (mode_ == Mode::kRecord) {
    trace::Event e;
    auto* r = e.mutable_mmio_read();
    r->set_address(address);
    r->set_size(size);
    r->set_value(device_value);
    r->set_rip(rip);
    append(std::move(e));
  } else if (mode_ == Mode::kReplay) {
    std::string what =
        fmt::format("mmio_read address={:#x} size={} value={:#x} rip={:#x}", address, size, device_value, rip);
    if (const auto* e = expect(trace::Event::kMmioRead, what)) {
      const auto& r = e->mmio_read();
      if (r.address() != address || r.size() != size || r.rip() != rip || r.value() != device_value) {
        diverge("MMIO read differs", describe_event(*e), what);
      }
      return r.value();
    }
  }
  return device_value;
}

uint64_t Engine::rdtsc(uint64_t rip, bool rdtscp) {
  if (derived_) return tsc_now();
  if (mode_ == Mode::kReplay) {
    std::string what = fmt::format("rdtsc rip={:#x}{}", rip, rdtscp ? " (rdtscp)" : "");
    if (const auto* e = expect(trace::Event::kRdtsc, what)) {
      if (e->rdtsc().rip() != rip || e->rdtsc().rdtscp() != rdtscp) diverge("RDTSC differs", describe_event(*e), what);
      return e->rdtsc().value();
    }
    return 0;
  }
  uint64_t value = tsc_now();
  if (mode_ == Mode::kRecord) {
    trace::Event e;
    e.mutable_rdtsc()->set_value(value);
    e.mutable_rdtsc()->set_rip(rip);
    e.mutable_rdtsc()->set_rdtscp(rdtscp);
    append(std::move(e));
  }
  return value;
}

std::pair<uint64_t, bool> Engine::rdrand(uint64_t rip, bool rdseed) {
  if (mode_ == Mode::kReplay) {
    std::string what = fmt::format("{} rip={:#x}", rdseed ? "rdseed" : "rdrand", rip);
    if (const auto* e = expect(trace::Event::kRdrand, what)) {
      if (e->rdrand().rip() != rip || e->rdrand().rdseed() != rdseed) {
        diverge("RDRAND differs", describe_event(*e), what);
      }
      return {e->rdrand().value(), e->rdrand().ok()};
    }
    return {0, false};
  }
  bool ok = false;
  uint64_t value = host_random(&ok);
  if (mode_ == Mode::kRecord) {
    trace::Event e;
    auto* r = e.mutable_rdrand();
    r->set_value(value);
    r->set_ok(ok);
    r->set_rip(rip);
    r->set_rdseed(rdseed);
    append(std::move(e));
  }
  return {value, ok};
}

uint64_t Engine::msr_read(uint32_t msr, uint64_t rip, uint64_t live_value) {
  if (derived_) return tsc_now();  // the TSC, the only such MSR: derived like RDTSC
  if (mode_ == Mode::kReplay) {
    std::string what = fmt::format("msr_read msr={:#x} rip={:#x}", msr, rip);
    if (const auto* e = expect(trace::Event::kMsrRead, what)) {
      if (e->msr_read().msr() != msr || e->msr_read().rip() != rip) diverge("MSR read differs", describe_event(*e), what);
      return e->msr_read().value();
    }
    return 0;
  }
  if (mode_ == Mode::kRecord) {
    trace::Event e;
    auto* r = e.mutable_msr_read();
    r->set_msr(msr);
    r->set_value(live_value);
    r->set_rip(rip);
    append(std::move(e));
  }
  return live_value;
}

std::pair<uint64_t, bool> Engine::device_msr_read(uint32_t msr, uint64_t device_value, bool device_fault,
                                                  uint64_t rip) {
  count_device_read();
  if (mode_ == Mode::kRecord) {
    trace::Event e;
    auto* r = e.mutable_msr_read();
    r->set_msr(msr);
    r->set_value(device_value);
    r->set_fault(device_fault);
    r->set_rip(rip);
    append(std::move(e));
  } else if (mode_ == Mode::kReplay) {
    std::string what = fmt::format("msr_read msr={:#x} value={:#x}{} rip={:#x}", msr, device_value,
                                   device_fault ? " (#GP)" : "", rip);
    if (const auto* e = expect(trace::Event::kMsrRead, what)) {
      const auto& r = e->msr_read();
      if (r.msr() != msr || r.rip() != rip || r.value() != device_value || r.fault() != device_fault) {
        diverge("MSR read differs", describe_event(*e), what);
      }
      return {r.value(), r.fault()};
    }
  }
  return {device_value, device_fault};
}

uint64_t Engine::tsc_now() {
  if (!derived_) return ns_to_tsc(host_now_ns());
  DerivedTime& d = *derived_;
  const uint64_t value =
      ns_to_tsc(d.anchor_ns) + uint64_t(derived_ps_since_anchor() * CpuModel::kTscHz / 1'000'000'000'000u);
  // Never backwards, never twice the same (an asynchronous event's host time may lie behind what derived time had
  // reached).
  d.last_tsc = std::max(value, d.last_tsc + 1);
  return d.last_tsc;
}

uint64_t Engine::derived_now_ns() {
  DerivedTime& d = *derived_;
  d.last_ns = std::max(d.last_ns, d.anchor_ns + uint64_t(derived_ps_since_anchor() / 1000));
  // Host time read when recording (the next asynchronous event's) is never less than derived time handed out.
  last_now_ = std::max(last_now_, d.last_ns);
  return d.last_ns;
}

unsigned __int128 Engine::derived_ps_since_anchor() const {
  const DerivedTime& d = *derived_;
  const uint64_t instructions = d.instructions().value_or(d.anchor_instructions);
  const uint64_t since = instructions > d.anchor_instructions ? instructions - d.anchor_instructions : 0;
  return (unsigned __int128)since * d.rates.ps_per_instruction +
         (unsigned __int128)(d.device_reads - d.anchor_device_reads) * d.rates.ns_per_device_read * 1000;
}

uint64_t Engine::instructions_until(uint64_t ns) {
  const uint64_t now = derived_now_ns();
  if (ns <= now) return 1;
  return uint64_t(((unsigned __int128)(ns - now) * 1000 + derived_->rates.ps_per_instruction - 1) /
                  derived_->rates.ps_per_instruction);
}

std::array<uint64_t, 5> Engine::derived_time_state() const {
  if (!derived_) return {};
  const DerivedTime& d = *derived_;
  // Not last_ns: a recording also reads the time for itself (when its timers are due), a replay does not, so the
  // highest time read differs between them at the same point (a restored replay has the recorder's).
  return {d.device_reads, d.anchor_ns, d.anchor_instructions, d.anchor_device_reads, d.last_tsc};
}

void Engine::derive_time(TimeRates rates, std::function<std::optional<uint64_t>()> instructions) {
  DEJA_ASSERT(rates.ps_per_instruction != 0, "derived time needs a rate");
  derived_ = DerivedTime{rates, std::move(instructions)};
  anchor_time(last_now_);
}

void Engine::anchor_time(uint64_t now_ns) {
  if (!derived_) return;
  derived_->anchor_ns = now_ns;
  derived_->anchor_instructions = derived_->instructions().value_or(0);
  derived_->anchor_device_reads = derived_->device_reads;
  derived_->last_ns = std::max(derived_->last_ns, now_ns);
}

// The guest-exit count is part of the coordinate in both modes: in exact mode it tells apart the visits
// of a loop that has no conditional branch but exits (an `sti; hlt` idle loop whose interrupt handler
// only acknowledges), which branches, RIP and registers cannot.
bool same_coordinate(const trace::Coordinate& recorded, const Position& p, ProgressMode progress) {
  if (recorded.vcpu() != p.at.vcpu || recorded.rip() != p.at.rip || recorded.rcx() != p.at.rcx ||
      recorded.gpr_digest() != p.gpr_digest || recorded.guest_exits() != p.guest_exits) {
    return false;
  }
  return progress == ProgressMode::kExitSync || recorded.branches() == p.at.branches;
}

bool instructions_differ(uint64_t recorded, const Position& p) {
  // 0 is "not counted" (a KVM recording); a replay on KVM does not count either.
  return recorded != 0 && p.instructions && *p.instructions != recorded;
}

void Engine::interrupt(uint8_t vector, const Position& where) {
  if (mode_ == Mode::kRecord) {
    trace::Event e;
    *e.mutable_interrupt()->mutable_at() = to_proto(where);
    e.mutable_interrupt()->set_vector(vector);
    append(std::move(e));
  } else if (mode_ == Mode::kReplay) {
    std::string what = fmt::format("interrupt vector={:#x} rip={:#x}", vector, where.at.rip);
    if (const auto* e = expect(trace::Event::kInterrupt, what)) {
      if (e->interrupt().vector() != vector || !same_coordinate(e->interrupt().at(), where, progress_)) {
        diverge("interrupt differs", describe_event(*e), what);
      }
    }
  }
}

void Engine::serial_output(std::span<const uint8_t> bytes) {
  if (mode_ == Mode::kRecord) {
    pending_output_.insert(pending_output_.end(), bytes.begin(), bytes.end());
    if (pending_output_.size() >= 4096) flush_output();
  } else if (mode_ == Mode::kReplay) {
    output_.add(StreamMatch::kReplayed, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    match_output();
  }
}

void Engine::match_output() {
  const auto& m = output_.mismatch();
  if (!m || divergence_) return;
  if (m->end == 0) {
    diverge("serial output differs",
            fmt::format("output byte {:#04x} after {} matching bytes", m->recorded, m->offset),
            fmt::format("output byte {:#04x}", m->replayed));
  } else {
    diverge("serial output differs", fmt::format("output bytes [{}, {}) (compared by SHA-256)", m->offset, m->end),
            "other bytes there");
  }
}

void Engine::check_output_complete() {
  if (mode_ != Mode::kReplay) return;
  match_output();
  if (uint64_t more = output_.pending(StreamMatch::kReplayed)) {
    diverge("the guest printed more than was recorded", "end of recorded output", fmt::format("{} more bytes", more));
  } else if (uint64_t less = output_.pending(StreamMatch::kRecorded)) {
    diverge("the guest printed less than was recorded", fmt::format("{} more bytes", less), "end of output");
  }
}

void Engine::record_async(const Position& where, uint64_t now_ns, std::span<const uint8_t> input,
                          std::span<const NetFrameIn> frames) {
  trace::Event e;
  auto* a = e.mutable_async();
  *a->mutable_at() = to_proto(where);
  a->set_now_ns(now_ns);
  // With derived time the instruction count is part of where the event lands: time goes on from there.
  if (derived_) a->set_instructions(where.instructions.value_or(0));
  if (!input.empty()) a->set_serial_input(input.data(), input.size());
  for (const NetFrameIn& f : frames) {
    auto* frame = a->add_net_frames();
    frame->set_nic(f.nic);
    frame->set_data(f.data.data(), f.data.size());
  }
  append(std::move(e));
}

void Engine::record_heartbeat(const Position& where, uint64_t instructions) {
  trace::Event e;
  auto* d = e.mutable_digest();
  *d->mutable_at() = to_proto(where);
  d->set_instructions(instructions);
  append(std::move(e));
  // Seal the chunk: after a crash the trace then reaches at least this heartbeat.
  flush_output();
  if (writer_) {
    if (auto r = writer_->flush(); !r && write_error_.empty()) write_error_ = r.error().message;
  }
}

static bool is_positional(const trace::Event& e) {
  return e.kind_case() == trace::Event::kAsync ||
         (e.kind_case() == trace::Event::kDigest && e.digest().digest().empty());
}

const trace::Event* Engine::next_positional() {
  if (divergence_) return nullptr;
  const trace::Event* e = peek();
  return e && is_positional(*e) ? e : nullptr;
}

const trace::Coordinate& Engine::positional_at(const trace::Event& e) const {
  return e.kind_case() == trace::Event::kAsync ? e.async().at() : e.digest().at();
}

bool Engine::positional_matches(const trace::Event& e, const Position& where) const {
  if (!same_coordinate(positional_at(e), where, progress_)) return false;
  // A heartbeat (and an asynchronous event, where time is derived) carries the instruction count, which tells
  // apart the visits of a loop that neither branches conditionally nor exits (where the backend counts them).
  return !instructions_differ(positional_instructions(e), where);
}

uint64_t Engine::positional_instructions(const trace::Event& e) {
  return e.kind_case() == trace::Event::kAsync ? e.async().instructions() : e.digest().instructions();
}

trace::Event Engine::consume_positional() {
  current_ = std::move(*lookahead_);
  lookahead_.reset();
  remember(current_);
  ++events_;
  if (current_.kind_case() == trace::Event::kAsync) last_now_ = current_.async().now_ns();
  return current_;
}

void Engine::begin_async(uint64_t now_ns) {
  frozen_now_ = now_ns;
  anchor_time(now_ns);
}
void Engine::end_async() { frozen_now_.reset(); }

namespace {

void to_proto(const DigestParts& parts, trace::DigestParts* out) {
  for (uint64_t r : parts.registers) out->add_registers(r);
  out->set_ram_region_bytes(DigestParts::kRamRegionBytes);
  for (uint64_t h : parts.ram_regions) out->add_ram_regions(h);
  for (uint64_t h : parts.devices) out->add_devices(h);
}

// Which parts of a differing digest differ (empty when the recording has no parts, or none of them differs).
std::string differing_parts(const trace::DigestParts& recorded, const DigestParts& now,
                            std::span<const std::string> device_names) {
  std::vector<std::string> found;
  if (recorded.registers_size() == int(now.registers.size())) {
    for (int i = 0; i < recorded.registers_size(); ++i) {
      if (recorded.registers(i) != now.registers[i]) {
        found.push_back(fmt::format("{} recorded {:#x} replayed {:#x}", now.register_name(i),
                                    recorded.registers(i), now.registers[i]));
      }
    }
  }
  if (recorded.ram_region_bytes() == DigestParts::kRamRegionBytes &&
      recorded.ram_regions_size() == int(now.ram_regions.size())) {
    std::vector<std::string> regions;
    for (int i = 0; i < recorded.ram_regions_size(); ++i) {
      if (recorded.ram_regions(i) == now.ram_regions[i]) continue;
      if (regions.size() < 8) {
        regions.push_back(fmt::format("[{:#x}, {:#x})", i * DigestParts::kRamRegionBytes,
                                      (i + 1) * DigestParts::kRamRegionBytes));
      } else if (regions.size() == 8) {
        regions.push_back("...");
      }
    }
    if (!regions.empty()) found.push_back(fmt::format("RAM in {}", fmt::join(regions, " ")));
  }
  if (recorded.devices_size() == int(now.devices.size())) {
    for (int i = 0; i < recorded.devices_size(); ++i) {
      if (recorded.devices(i) == now.devices[i]) continue;
      found.push_back(fmt::format("device {}", size_t(i) < device_names.size() ? device_names[i]
                                                                                : fmt::format("#{}", i)));
    }
  }
  return fmt::format("{}", fmt::join(found, "; "));
}

}  // namespace

void Engine::record_digest(const Position& where, const Digest& digest, uint64_t instructions,
                           const DigestParts& parts, std::span<const std::string> device_names) {
  if (mode_ == Mode::kRecord) {
    trace::Event e;
    auto* d = e.mutable_digest();
    *d->mutable_at() = to_proto(where);
    d->set_digest(digest.bytes.data(), digest.bytes.size());
    d->set_instructions(instructions);
    to_proto(parts, d->mutable_parts());
    append(std::move(e));
  } else if (mode_ == Mode::kReplay) {
    std::string got(reinterpret_cast<const char*>(digest.bytes.data()), digest.bytes.size());
    std::string what = fmt::format("state digest at rip={:#x}", where.at.rip);
    if (const auto* e = expect(trace::Event::kDigest, what)) {
      if (e->digest().digest() != got || !same_coordinate(e->digest().at(), where, progress_)) {
        std::string parts_differing = e->digest().digest() != got && e->digest().has_parts()
                                          ? differing_parts(e->digest().parts(), parts, device_names)
                                          : std::string();
        diverge(parts_differing.empty() ? std::string("machine state differs (registers, RAM or devices)")
                                        : "machine state differs: " + parts_differing,
                describe_event(*e), fmt::format("digest {} at rip={:#x} guest-exits {}", digest.hex(), where.at.rip,
                                                where.guest_exits));
      } else if (instructions_differ(e->digest().instructions(), where)) {
        diverge("the instruction count differs at a state digest", describe_event(*e),
                fmt::format("{} instructions", *where.instructions));
      }
    }
  }
}

const trace::End* Engine::expect_end(const std::string& what) {
  const trace::Event* e = expect(trace::Event::kEnd, what);
  return e ? &e->end() : nullptr;
}

Result<> Engine::finish_record(trace::End end, trace::Footer footer) {
  flush_output();  // all output precedes the End event, where replay checks it
  trace::Event e;
  *e.mutable_end() = std::move(end);
  append(std::move(e));
  if (!write_error_.empty()) return fail(ErrorKind::kHost, "writing the trace failed: {}", write_error_);
  if (!writer_) return {};
  return writer_->finish(std::move(footer));
}

uint64_t Engine::next_raw_event() const {
  if (mode_ == Mode::kRecord) return writer_ ? writer_->events_written() : 0;
  const uint64_t taken = rewind_ ? history_pos_ : reader_ ? reader_->events_read() : 0;
  return taken - (lookahead_ ? 1 : 0);
}

Result<Engine::Cursor> Engine::save_cursor() {
  DEJA_ASSERT(!frozen_now_ && !divergence_, "the replay cursor is saved only at a clean point");
  Cursor c;
  if (mode_ == Mode::kRecord) {
    // A replay here has taken every event written so far, the serial output too (written now, so that it precedes
    // the cursor), and peeked at none: it matched all that output.
    if (!writer_) return fail(ErrorKind::kInvalidArgument, "no cursor: this recording writes no trace");
    flush_output();
    c.raw_position = writer_->events_written();
    c.output = StreamMatch::Literal{StreamMatch::kRecorded, {}, writer_->serial_bytes()};
  } else {
    auto output = output_.literal_state();
    if (!output) {
      return fail(ErrorKind::kUnsupported,
                  "no checkpoint while the recorded and replayed serial output are {} bytes apart",
                  output_.pending(StreamMatch::kRecorded) + output_.pending(StreamMatch::kReplayed));
    }
    c.raw_position = rewind_ ? history_pos_ : reader_ ? reader_->events_read() : 0;
    c.has_lookahead = lookahead_.has_value();
    c.output = std::move(*output);
  }
  c.events = events_;
  c.last_now = last_now_;
  c.recent = recent_;
  if (derived_) {
    c.device_reads = derived_->device_reads;
    c.anchor_ns = derived_->anchor_ns;
    c.anchor_instructions = derived_->anchor_instructions;
    c.anchor_device_reads = derived_->anchor_device_reads;
    c.last_ns = derived_->last_ns;
    c.last_tsc = derived_->last_tsc;
  }
  return c;
}

Result<> Engine::restore_cursor(const Cursor& c) {
  if (!reader_) return fail(ErrorKind::kInvalidArgument, "the replay cursor cannot move: no trace");
  if (c.raw_position == 0 && c.has_lookahead) return fail(ErrorKind::kInvalidArgument, "replay cursor: lookahead at 0");
  if (rewind_) {
    // Read ahead when the cursor lies beyond what this replay has read (a checkpoint file).
    history_pos_ = history_.size();
    exhausted_ = false;
    trace_error_.clear();
    while (history_.size() < c.raw_position) {
      if (!next_raw()) {
        return fail(ErrorKind::kBadTrace, "the trace ends after {} events, before the checkpoint's position {}{}",
                    history_.size(), c.raw_position, trace_error_.empty() ? "" : ": " + trace_error_);
      }
    }
    exhausted_ = false;
    trace_error_.clear();
    history_pos_ = c.raw_position;
    lookahead_.reset();
    if (c.has_lookahead) lookahead_ = history_[c.raw_position - 1];
  } else {
    const uint64_t taken = c.raw_position - (c.has_lookahead ? 1 : 0);
    if (reader_->events_read() != 0 || lookahead_ || events_ != 0) {
      if (reader_->events_read() == c.raw_position && lookahead_.has_value() == c.has_lookahead) {
        // Already there (a replay restored to where it stands).
      } else {
        return fail(ErrorKind::kInvalidArgument, "the replay cursor cannot move back without a rewindable trace");
      }
    } else {
      if (auto moved = reader_->start_at_event(taken); !moved) return moved;
      if (c.has_lookahead) {
        auto next = next_raw();
        if (!next) {
          return fail(ErrorKind::kBadTrace, "the trace ends before the checkpoint's position {}{}", c.raw_position,
                      trace_error_.empty() ? "" : ": " + trace_error_);
        }
        lookahead_ = std::move(*next);
      }
    }
  }
  output_.restore(c.output);
  events_ = c.events;
  last_now_ = c.last_now;
  if (derived_) {
    derived_->device_reads = c.device_reads;
    derived_->anchor_ns = c.anchor_ns;
    derived_->anchor_instructions = c.anchor_instructions;
    derived_->anchor_device_reads = c.anchor_device_reads;
    derived_->last_ns = c.last_ns;
    derived_->last_tsc = c.last_tsc;
  }
  frozen_now_.reset();
  recent_ = c.recent;
  divergence_.reset();
  return {};
}

}  // namespace deja
