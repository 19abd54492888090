// The run loop shared by run, record and replay: exits go to the bus through the engine's choke points.
#include "vmm/session.h"

#include <poll.h>
#include <signal.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "interp/interp_backend.h"
#include "kvm/pmu.h"
#include "logging/trace_format.h"
#include "logging/trace_inspect.h"
#include "vmm/build_info.h"
#include "vmm/coordinate_seeker.h"
#include "vmm/cpu_model.h"
#include "vmm/digest.h"
#include "vmm/exit_status.h"
#include "vmm/host_io.h"

namespace deja {
namespace {

std::atomic<bool> g_stop_requested{false};
std::atomic<Backend*> g_kick_target{nullptr};

void on_stop_signal(int) {
  g_stop_requested.store(true);
  if (Backend* b = g_kick_target.load()) b->kick();
}

template <typename... Args>
void say(fmt::format_string<Args...> format, Args&&... args) {
  std::string line = "deja: " + fmt::format(format, std::forward<Args>(args)...) + "\n";
  std::fputs(line.c_str(), stderr);
}

// Serial output goes to the user's sink and, through the engine, into the trace.
class TeeSink : public ByteSink {
 public:
  TeeSink(ByteSink& out, Engine& engine) : out_(out), engine_(engine) {}
  void write(std::span<const uint8_t> bytes) override {
    out_.write(bytes);
    engine_.serial_output(bytes);
    bytes_ += bytes.size();
  }
  uint64_t bytes() const { return bytes_; }

 private:
  ByteSink& out_;
  Engine& engine_;
  uint64_t bytes_ = 0;
};

// Bus accesses of 1 to 8 bytes, little-endian, as the exits carry them.
uint64_t bus_read(Bus& bus, uint64_t address, unsigned size) {
  uint8_t data[8] = {};
  bus.read(address, std::span(data, size));
  return load_le(std::span(data, size));
}

void bus_write(Bus& bus, uint64_t address, unsigned size, uint64_t value) {
  uint8_t data[8];
  store_le(std::span(data, size), value);
  bus.write(address, std::span(data, size));
}

struct Outcome {
  int status = 0;
  std::string reason;       // "guest exit", "triple fault", ...
  bool guest_exit = false;  // ended through isa-debug-exit
  bool recorded_end = false;  // replay reached the End of a recording that stopped here (e.g. interrupted)
};

class Session {
 public:
  Session(Mode mode, ProgressMode progress) : engine_(mode, progress) {}

  Engine& engine() { return engine_; }

  Result<> build(const MachineConfig& config, const std::string& serial_out, std::span<const uint8_t> image,
                 const std::string& image_name, const LoadOptions& load,
                 std::span<const std::vector<uint8_t>> modules) {
    auto sink = FileSink::open(serial_out);
    if (!sink) return std::unexpected(sink.error());
    out_ = std::move(*sink);
    tee_ = std::make_unique<TeeSink>(*out_, engine_);
    auto machine = Machine::create(config, engine_, *tee_);
    if (!machine) return std::unexpected(machine.error());
    machine_ = std::move(*machine);
    auto loaded = load_guest_image_bytes(machine_->memory(), image, image_name, load, modules);
    if (!loaded) return std::unexpected(loaded.error());
    if (auto s = machine_->backend().set_state(loaded->initial_state); !s) return std::unexpected(s.error());
    engine_.set_position_source([this] { return position(); });
    return {};
  }

  Result<> setup_progress(const ProgressChoice& choice);
  // Exact mode: what counts progress (for the trace header and messages).
  std::string counter_description() {
    ProgressCounter* c = machine_->backend().progress_counter();
    return c ? c->describe() : std::string();
  }

  void attach_input(std::unique_ptr<FdInput> input) { input_ = std::move(input); }
  Machine& machine() { return *machine_; }
  uint64_t serial_bytes() const { return tee_ ? tee_->bytes() : 0; }
  void set_digest_interval(uint64_t n) { digest_interval_ = n; }

  Result<Outcome> run();
  void print_stats();
  Digest final_cpu_ram_digest();
  Digest final_machine_digest();
  uint64_t wall_ns() const { return wall_ns_; }
  Position current_position() { return position(); }

 private:
  Position position();
  bool guest_caused(ExitKind kind) const;
  void poll_async();
  void apply_async(uint64_t now_ns, std::span<const uint8_t> input);
  void replay_async();
  Result<> deliver_interrupts();
  Result<std::optional<Outcome>> handle_exit(VcpuExit& exit);
  Result<std::optional<Outcome>> wait_for_wake();
  void maybe_digest();
  void start_kicker();
  void stop_kicker();
  std::optional<Outcome> replay_end_here();

  Engine engine_;
  std::unique_ptr<FileSink> out_;
  std::unique_ptr<TeeSink> tee_;
  std::unique_ptr<Machine> machine_;
  std::unique_ptr<FdInput> input_;
  uint64_t guest_exits_ = 0;
  ExitKind last_exit_kind_ = ExitKind::kKicked;
  uint64_t last_exit_rip_ = 0;
  uint64_t digest_interval_ = 16384;
  uint64_t next_digest_at_ = 16384;
  std::map<ExitKind, uint64_t> exit_counts_;
  std::unique_ptr<CoordinateSeeker> seeker_;  // replay in exact mode
  uint64_t wall_ns_ = 0;
  bool warned_spin_ = false;
  uint64_t last_guest_exit_host_ns_ = HostClock::monotonic_ns();
  static constexpr uint64_t kSpinWarnNs = 1'000'000'000, kSpinStopNs = 10'000'000'000;
  static constexpr uint64_t kHeartbeatNs = 1'000'000'000;
  uint64_t next_heartbeat_ = 0;

  std::thread kicker_;
  std::atomic<bool> kicker_stop_{false};
  std::atomic<uint64_t> kick_at_{UINT64_MAX};  // host monotonic ns
};

bool Session::guest_caused(ExitKind kind) const {
  switch (kind) {
    case ExitKind::kIoIn:
    case ExitKind::kIoOut:
    case ExitKind::kMmioRead:
    case ExitKind::kMmioWrite:
    case ExitKind::kHlt:
    case ExitKind::kMsrRead:
    case ExitKind::kMsrWrite:
      return true;
    default:
      return false;
  }
}

Result<> Session::setup_progress(const ProgressChoice& choice) {
  if (choice.mode != ProgressMode::kExact) return {};
  Backend& cpu = machine_->backend();
  if (choice.emulated_skid) {
    auto* interp = dynamic_cast<InterpBackend*>(&cpu);
    if (!interp) {
      return fail(ErrorKind::kInvalidArgument,
                  "--progress emulated-pmu needs the software CPU (--backend interp); {} has a real counter or none",
                  cpu.name());
    }
    uint64_t seed = choice.emulated_seed ? *choice.emulated_seed : std::random_device{}();
    interp->emulate_pmu_skid(*choice.emulated_skid, seed);
    say("note: emulating a PMU whose overflow lands up to {} branches late (repeat with --progress "
        "emulated-pmu:{}:{})",
        *choice.emulated_skid, *choice.emulated_skid, seed);
  } else if (!cpu.progress_counter()) {
    if (auto r = attach_pmu_counter(cpu); !r) return r;
  }
  if (engine_.mode() == Mode::kReplay) seeker_ = std::make_unique<CoordinateSeeker>(cpu, *cpu.progress_counter());
  return {};
}

Position Session::position() {
  Position p;
  p.guest_exits = guest_exits_;
  if (engine_.progress() == ProgressMode::kExitSync) {
    // Exit-synchronous coordinates: the n-th guest-caused exit and the instruction that caused it.
    p.at.rip = last_exit_rip_;
    return p;
  }
  auto st = machine_->backend().get_state();
  if (st) {
    p.at.rip = st->rip;
    p.at.rcx = st->gpr[kRcx];
    p.gpr_digest = gpr_digest(*st);
  }
  p.at.branches = machine_->backend().branch_count().value_or(0);
  return p;
}

void Session::apply_async(uint64_t now_ns, std::span<const uint8_t> input) {
  engine_.begin_async(now_ns);
  machine_->advance_devices(now_ns);
  if (!input.empty()) machine_->uart().receive(input);
  engine_.end_async();
}

// Run / record: let host time and host input into the machine, if anything is due.
void Session::poll_async() {
  uint64_t now = engine_.host_now_ns();
  auto deadline = machine_->next_deadline_ns();
  bool due = deadline && *deadline <= now;
  uint8_t buf[256];
  size_t n = 0;
  if (input_ && !input_->at_end()) {
    size_t space = std::min(machine_->uart().rx_space(), sizeof(buf));
    if (space > 0) n = input_->read_available(std::span(buf, space));
  }
  if (!due && n == 0) return;
  if (engine_.mode() == Mode::kRecord) engine_.record_async(position(), now, std::span(buf, n));
  apply_async(now, std::span(buf, n));
}

// Replay: apply every recorded async event (and check every heartbeat) that lands exactly here.
void Session::replay_async() {
  while (const trace::Event* e = engine_.next_positional()) {
    Position here = position();
    if (!engine_.positional_matches(*e, here)) {
      // In exact mode the backend stops on the coordinate, so being past it means divergence.
      const trace::Coordinate& at = engine_.positional_at(*e);
      bool passed = engine_.progress() == ProgressMode::kExact ? here.at.branches > at.branches()
                                                               : here.guest_exits >= at.guest_exits();
      if (passed) {
        engine_.report_divergence("the guest is not where the recording says it was at this point",
                                  describe_event(*e),
                                  fmt::format("branches {} rip {:#x} rcx {:#x} gpr-digest {:016x} guest-exits {}",
                                              here.at.branches, here.at.rip, here.at.rcx, here.gpr_digest,
                                              here.guest_exits));
      }
      return;
    }
    trace::Event taken = engine_.consume_positional();
    if (taken.kind_case() == trace::Event::kAsync) {
      const auto& a = taken.async();
      apply_async(a.now_ns(), std::span(reinterpret_cast<const uint8_t*>(a.serial_input().data()),
                                        a.serial_input().size()));
    }
  }
}

Result<> Session::deliver_interrupts() {
  Backend& cpu = machine_->backend();
  if (!machine_->pic().interrupt_pending()) {
    cpu.request_interrupt_window(false);
    return {};
  }
  if (engine_.progress() == ProgressMode::kExitSync && engine_.mode() != Mode::kRun) {
    // Exit-synchronous: inject only at guest-caused exits (delivered right after the exiting
    // instruction), never through interrupt-window exits, whose timing an emulated CPU (nested KVM
    // under QEMU) does not reproduce exactly from run to run.
    cpu.request_interrupt_window(false);
    if (!guest_caused(last_exit_kind_) || !cpu.can_inject_interrupt()) return {};
  } else if (!cpu.can_inject_interrupt()) {
    cpu.request_interrupt_window(true);
    return {};
  }
  uint8_t vector = machine_->pic().acknowledge();
  engine_.interrupt(vector, position());
  cpu.request_interrupt_window(false);
  last_exit_kind_ = ExitKind::kKicked;  // one injection per exit
  return cpu.inject_interrupt(vector);
}

void Session::maybe_digest() {
  if (engine_.mode() == Mode::kRun || engine_.events_processed() < next_digest_at_) return;
  next_digest_at_ = engine_.events_processed() + digest_interval_;
  Digest d = final_machine_digest();
  engine_.record_digest(position(), d.bytes, machine_->backend().instruction_count().value_or(0));
}

Digest Session::final_cpu_ram_digest() {
  auto st = machine_->backend().get_state();
  return cpu_ram_digest(st ? *st : CpuState{}, machine_->memory());
}

Digest Session::final_machine_digest() {
  auto st = machine_->backend().get_state();
  auto devices = machine_->device_states();
  return machine_digest(st ? *st : CpuState{}, machine_->memory(), devices);
}

// HLT in run/record: sleep (in host time) until a device event or input can wake the guest.
Result<std::optional<Outcome>> Session::wait_for_wake() {
  for (;;) {
    if (machine_->pic().interrupt_pending()) return std::nullopt;
    if (g_stop_requested.load()) return std::nullopt;
    auto deadline = machine_->next_deadline_ns();
    bool input_open = input_ && !input_->at_end();
    if (!deadline && !input_open) {
      return Outcome{exit_status::kGuestStopped, "the guest halted with no timer armed and no input attached", false};
    }
    uint64_t now = engine_.host_now_ns();
    if (!deadline || *deadline > now) {
      uint64_t wait_ns = deadline ? *deadline - now : 100'000'000;
      int timeout_ms = int(std::min<uint64_t>((wait_ns + 999'999) / 1'000'000, 100));
      pollfd pfd{input_open ? input_->fd() : -1, POLLIN, 0};
      ::poll(&pfd, 1, timeout_ms);
    }
    poll_async();
  }
}

std::optional<Outcome> Session::replay_end_here() {
  const trace::Event* e = engine_.peek();
  if (!e || e->kind_case() != trace::Event::kEnd) return std::nullopt;
  const auto& end = e->end();
  if (end.reason() == "guest exit") return std::nullopt;  // reached through the guest's own exit port write
  Position here = position();
  bool at = engine_.progress() == ProgressMode::kExact
                ? end.at().branches() == here.at.branches && end.at().rip() == here.at.rip
                : end.at().guest_exits() == here.guest_exits;
  if (!at) return std::nullopt;
  return Outcome{end.exit_status(), end.reason(), false, true};
}

Result<std::optional<Outcome>> Session::handle_exit(VcpuExit& exit) {
  ++exit_counts_[exit.kind];
  last_exit_kind_ = exit.kind;
  if (guest_caused(exit.kind)) {
    ++guest_exits_;
    last_exit_rip_ = exit.rip;
    if (engine_.mode() == Mode::kRecord) last_guest_exit_host_ns_ = HostClock::monotonic_ns();
  }
  switch (exit.kind) {
    case ExitKind::kIoIn:
      exit.value = engine_.port_read(exit.port, exit.size, bus_read(machine_->pio(), exit.port, exit.size), exit.rip);
      break;
    case ExitKind::kIoOut:
      bus_write(machine_->pio(), exit.port, exit.size, exit.value);
      if (auto status = machine_->debug_exit().exit_status()) return Outcome{*status, "guest exit", true};
      break;
    case ExitKind::kMmioRead:
      exit.value =
          engine_.mmio_read(exit.address, exit.size, bus_read(machine_->mmio(), exit.address, exit.size), exit.rip);
      break;
    case ExitKind::kMmioWrite:
      bus_write(machine_->mmio(), exit.address, exit.size, exit.value);
      break;
    case ExitKind::kRdtsc:
      exit.value = engine_.rdtsc(exit.rip, exit.is_rdtscp);
      break;
    case ExitKind::kRdrand: {
      auto [value, ok] = engine_.rdrand(exit.rip, exit.is_rdseed);
      exit.value = value;
      exit.ok = ok;
      break;
    }
    case ExitKind::kMsrRead:
      // The TSC is the only MSR outside the vCPU that deja emulates; every other one is #GP,
      // as on a CPU that lacks it.
      if (exit.msr == msr::kTsc) {
        exit.value = engine_.msr_read(exit.msr, exit.rip, engine_.mode() == Mode::kReplay ? 0 : engine_.tsc_now());
        exit.fault = false;
      } else {
        exit.fault = true;
      }
      break;
    case ExitKind::kMsrWrite:
      exit.fault = true;
      break;
    case ExitKind::kHlt: {
      auto st = machine_->backend().get_state();
      if (!st) return std::unexpected(st.error());
      if (!(st->rflags & rflags::kIf) && !machine_->pic().interrupt_pending()) {
        return Outcome{exit_status::kGuestStopped,
                       fmt::format("the guest halted with interrupts disabled at rip={:#x}", st->rip), false};
      }
      break;
    }
    case ExitKind::kInterruptWindow:
    case ExitKind::kCoordinateReached:
    case ExitKind::kDebug:
      break;
    case ExitKind::kCoordinateMissed:
      if (engine_.mode() == Mode::kReplay && engine_.peek()) {
        engine_.report_divergence("the guest went past the point where the recording has its next event, "
                                  "without reaching it: " + exit.detail,
                                  describe_event(*engine_.peek()), "no stop at that coordinate");
      }
      break;
    case ExitKind::kKicked:
      if (engine_.mode() == Mode::kRecord && engine_.progress() == ProgressMode::kExitSync) {
        // Exit-synchronous recording can let time in only at the guest's own exits. A guest that
        // spins without I/O while its timer is due would wait forever: warn, then stop cleanly.
        auto deadline = machine_->next_deadline_ns();
        uint64_t now = engine_.host_now_ns();
        uint64_t quiet = HostClock::monotonic_ns() - last_guest_exit_host_ns_;
        if (deadline && now > *deadline + kSpinWarnNs && quiet > kSpinWarnNs && !warned_spin_) {
          warned_spin_ = true;
          say("warning: the guest has run for a second without I/O while a timer event is due; exit-synchronous "
              "recording (KVM without a PMU) delivers interrupts only at the guest's I/O and HLT exits");
        }
        if (deadline && now > *deadline + kSpinStopNs && quiet > kSpinStopNs) {
          return Outcome{exit_status::kGuestStopped,
                         fmt::format("stopped: the guest spun for {} s without I/O while a timer interrupt was due; "
                                     "exit-synchronous recording cannot deliver it (record with --backend interp "
                                     "--progress exact)",
                                     kSpinStopNs / 1'000'000'000),
                         false};
        }
      }
      break;
    case ExitKind::kShutdown:
      return Outcome{exit_status::kGuestStopped, exit.detail.empty() ? std::string("triple fault") : exit.detail, false};
    case ExitKind::kFault:
      return Outcome{exit_status::kGuestStopped, "vCPU stopped: " + exit.detail, false};
  }
  return std::nullopt;
}

void Session::start_kicker() {
  Backend* backend = &machine_->backend();
  g_kick_target.store(backend);
  kicker_ = std::thread([this, backend] {
    while (!kicker_stop_.load()) {
      uint64_t now = HostClock::monotonic_ns();
      uint64_t at = kick_at_.load();
      if (now >= at) {
        backend->kick();
        kick_at_.store(now + 50'000'000);  // until the vCPU thread publishes the next deadline
        continue;
      }
      std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<uint64_t>(at - now, 5'000'000)));
    }
  });
}

void Session::stop_kicker() {
  kicker_stop_.store(true);
  if (kicker_.joinable()) kicker_.join();
  g_kick_target.store(nullptr);
}

Result<Outcome> Session::run() {
  Backend& cpu = machine_->backend();
  const Mode mode = engine_.mode();
  const bool exact = engine_.progress() == ProgressMode::kExact;
  next_digest_at_ = digest_interval_;
  uint64_t started = HostClock::monotonic_ns();
  next_heartbeat_ = started + kHeartbeatNs;
  if (mode != Mode::kReplay) start_kicker();
  struct KickerGuard {
    Session* s;
    ~KickerGuard() { s->stop_kicker(); }
  } guard{this};

  for (;;) {
    if (mode == Mode::kReplay) {
      replay_async();
      if (auto end = replay_end_here()) return *end;
    }
    if (engine_.divergence()) return Outcome{exit_status::kDivergence, "divergence", false};
    if (mode == Mode::kReplay && engine_.replay_exhausted() && !engine_.peek()) {
      return Outcome{exit_status::kTraceEnded, "end of trace", false};
    }
    if (g_stop_requested.load()) return Outcome{exit_status::kInterrupted, "interrupted", false};
    if (auto r = deliver_interrupts(); !r) return std::unexpected(r.error());

    if (seeker_) {
      std::optional<SeekTarget> target;
      if (const trace::Event* next = engine_.peek()) {
        const trace::Coordinate* at = nullptr;
        if (engine_.next_positional()) at = &engine_.positional_at(*next);
        if (next->kind_case() == trace::Event::kEnd && next->end().reason() != "guest exit") at = &next->end().at();
        if (at) target = SeekTarget{Coordinate{at->vcpu(), at->branches(), at->rip(), at->rcx()}, at->gpr_digest()};
      }
      seeker_->set_target(target);
    } else if (mode != Mode::kReplay) {
      auto deadline = machine_->next_deadline_ns();
      uint64_t kick = deadline ? engine_.host_origin_ns() + *deadline : UINT64_MAX;
      if (input_ && !input_->at_end()) kick = std::min(kick, HostClock::monotonic_ns() + 10'000'000);
      if (mode == Mode::kRecord) kick = std::min(kick, next_heartbeat_);
      kick_at_.store(kick);
    }

    auto exit = seeker_ ? seeker_->run() : cpu.run();
    if (!exit) return std::unexpected(exit.error());
    auto done = handle_exit(**exit);
    if (!done) return std::unexpected(done.error());
    if (*done) {
      wall_ns_ = HostClock::monotonic_ns() - started;
      return **done;
    }
    if (engine_.divergence()) continue;

    // Where asynchronous events may land: anywhere in a plain run; at instruction boundaries the
    // backend can find again (exact) or right after guest-caused exits (exit-sync) when recording.
    bool boundary_or_exit = mode == Mode::kRun ? true
                            : exact ? ((*exit)->kind == ExitKind::kKicked || (*exit)->kind == ExitKind::kHlt ||
                                       (*exit)->kind == ExitKind::kInterruptWindow)
                                    : guest_caused((*exit)->kind);
    if (mode != Mode::kReplay && boundary_or_exit) {
      poll_async();
      if (mode == Mode::kRecord && HostClock::monotonic_ns() >= next_heartbeat_) {
        next_heartbeat_ = HostClock::monotonic_ns() + kHeartbeatNs;
        engine_.record_heartbeat(position(), cpu.instruction_count().value_or(0));
      }
    }
    if ((*exit)->kind == ExitKind::kHlt) {
      if (mode == Mode::kReplay) {
        replay_async();
        if (auto end = replay_end_here()) return *end;
        if (!machine_->pic().interrupt_pending() && !engine_.divergence() && engine_.peek()) {
          engine_.report_divergence("the guest halted, but the recording has no event to wake it here",
                                    describe_event(*engine_.peek()), "HLT");
        }
      } else {
        auto woke = wait_for_wake();
        if (!woke) return std::unexpected(woke.error());
        if (*woke) {
          wall_ns_ = HostClock::monotonic_ns() - started;
          return **woke;
        }
      }
    }
    maybe_digest();
  }
}

void Session::print_stats() {
  say("exits by kind:");
  for (const auto& [kind, count] : exit_counts_) say("  {:<20} {}", exit_kind_name(kind), count);
  if (auto n = machine_->backend().instruction_count()) say("instructions retired: {}", *n);
  if (auto n = machine_->backend().branch_count()) say("conditional branches retired: {}", *n);
  if (seeker_) {
    const auto& st = seeker_->stats();
    say("coordinate seeking ({}, skid {}): {} reached, {} counter overflows, {} breakpoint hits, {} single steps",
        counter_description(), machine_->backend().progress_counter()->skid(), st.reached, st.overflows,
        st.breakpoint_hits, st.single_steps);
  }
  const auto& unknown = machine_->pio().unknown_accesses();
  if (unknown.empty()) {
    say("unknown ports: none");
  } else {
    say("unknown ports (read as all ones, writes ignored):");
    for (const auto& [port, acc] : unknown) say("  port {:#06x}: {} reads, {} writes", port, acc.reads, acc.writes);
  }
  for (const auto& [addr, acc] : machine_->mmio().unknown_accesses()) {
    say("  unmapped MMIO {:#x}: {} reads, {} writes", addr, acc.reads, acc.writes);
  }
  if (auto* interp = dynamic_cast<const InterpBackend*>(&machine_->backend())) {
    auto counts = interp->unimplemented_counts();
    if (counts.empty()) {
      say("unimplemented instructions: none executed");
    } else {
      say("unimplemented instructions (raised #UD in the guest):");
      for (const auto& [mnemonic, count] : counts) say("  {:<16} {}", mnemonic, count);
    }
  }
}

void install_signal_handlers() {
  g_stop_requested.store(false);
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int report_error(const Error& e) {
  say("{}", e.message);
  switch (e.kind) {
    case ErrorKind::kInvalidArgument:
    case ErrorKind::kBadImage:
    case ErrorKind::kBadTrace:
    case ErrorKind::kUnsupported:
      return exit_status::kUsage;
    case ErrorKind::kDivergence:
      return exit_status::kDivergence;
    case ErrorKind::kGuest:
      return exit_status::kGuestStopped;
    case ErrorKind::kHost:
      return exit_status::kHostFailure;
  }
  return exit_status::kHostFailure;
}

void finish_outcome_message(const Outcome& o) {
  if (!o.guest_exit && o.status != exit_status::kDivergence && o.status != exit_status::kTraceEnded) {
    // Backends put the register dump and the last exits into the reason of a stopped vCPU.
    say("{}", o.reason);
  }
}

struct Prepared {
  std::vector<uint8_t> image;
  std::vector<std::vector<uint8_t>> modules;
};

Result<Prepared> read_inputs(const std::string& image_path, const LoadOptions& load) {
  Prepared p;
  auto image = read_boot_file(image_path, "guest image");
  if (!image) return std::unexpected(image.error());
  p.image = std::move(*image);
  for (const auto& m : load.modules) {
    auto bytes = read_boot_file(m.path, "boot module");
    if (!bytes) return std::unexpected(bytes.error());
    p.modules.push_back(std::move(*bytes));
  }
  return p;
}

trace::InputFile input_file(const std::string& role, const std::string& path, std::span<const uint8_t> bytes) {
  trace::InputFile f;
  f.set_role(role);
  f.set_path(path);
  auto sha = sha256_bytes(bytes);
  f.set_sha256(sha.data(), sha.size());
  f.set_size(bytes.size());
  return f;
}

int run_or_record(const SessionOptions& options, Mode mode) {
  install_signal_handlers();
  auto inputs = read_inputs(options.image_path, options.load);
  if (!inputs) return report_error(inputs.error());

  MachineConfig config = options.machine;
  int64_t start_unix_ns = host_unix_time_ns();
  config.rtc_epoch_unix_seconds = start_unix_ns / 1'000'000'000;

  ProgressChoice progress = options.progress;
  if (progress.automatic) {
    // A plain run places nothing, so only a recording needs the self-test.
    progress.mode = ProgressMode::kExitSync;
    if (mode == Mode::kRecord) {
      PmuSelftest pmu = run_pmu_selftest();
      if (pmu.usable()) {
        progress.mode = ProgressMode::kExact;
      } else {
        say("warning: no precise interrupt timing on this host ({}); recording exit-synchronously (see `deja "
            "selftest`)",
            pmu.first_failure());
      }
    }
  }
  Session session(mode, progress.mode);
  std::unique_ptr<FdInput> input;
  if (!options.serial_in.empty()) {
    auto in = FdInput::open(options.serial_in);
    if (!in) return report_error(in.error());
    input = std::move(*in);
  }
  if (auto built = session.build(config, options.serial_out, inputs->image, options.image_path, options.load,
                                 inputs->modules);
      !built) {
    return report_error(built.error());
  }
  if (auto r = session.setup_progress(progress); !r) return report_error(r.error());
  session.attach_input(std::move(input));
  session.set_digest_interval(options.digest_interval);

  if (mode == Mode::kRecord) {
    trace::Header header;
    header.set_format_version(kTraceFormatVersion);
    header.set_cpu_model_version(CpuModel::current().version());
    header.set_device_model_version(kDeviceModelVersion);
    header.set_build_id(build_id());
    header.set_deja_version(deja_version());
    header.set_host(host_description());
    header.set_start_unix_ns(start_unix_ns);
    *header.add_inputs() = input_file("image", options.image_path, inputs->image);
    for (size_t i = 0; i < options.load.modules.size(); ++i) {
      auto* f = header.add_inputs();
      *f = input_file("module", options.load.modules[i].path, inputs->modules[i]);
    }
    if (!options.serial_in.empty() && options.serial_in != "-") {
      if (auto sha = sha256_file(options.serial_in)) {
        auto* f = header.add_inputs();
        f->set_role("serial-in");
        f->set_path(options.serial_in);
        f->set_sha256(sha->data(), sha->size());
      }
    }
    auto* c = header.mutable_config();
    c->set_memory_bytes(config.memory_bytes);
    c->set_cmdline(config.cmdline);
    c->set_vcpus(1);
    c->set_backend(config.backend);
    c->set_progress_mode(std::string(progress_mode_name(progress.mode)));
    if (progress.mode == ProgressMode::kExact) c->set_progress_counter(session.counter_description());
    c->set_serial_input(!options.serial_in.empty());
    for (const auto& m : options.load.modules) c->add_module_args(m.args);
    c->set_rdtsc_trapped(session.machine().backend().traps_rdtsc());
    c->set_tsc_hz(CpuModel::kTscHz);
    c->set_device_semantics(config.device_semantics);
    auto writer = TraceWriter::create(options.trace_path, header);
    if (!writer) return report_error(writer.error());
    session.engine().attach_writer(std::move(*writer));
  }

  auto outcome = session.run();
  if (!outcome) {
    int status = report_error(outcome.error());
    if (mode == Mode::kRecord) {
      trace::End end;
      end.set_exit_status(status);
      end.set_reason("host failure: " + outcome.error().message);
      (void)session.engine().finish_record(end, trace::Footer{});
    }
    return status;
  }
  finish_outcome_message(*outcome);
  if (options.stats) session.print_stats();
  if (options.print_digest) say("digest {}", session.final_cpu_ram_digest().hex());

  if (mode == Mode::kRecord) {
    Digest full = session.final_machine_digest();
    auto& backend = session.machine().backend();
    trace::End end;
    *end.mutable_at() = to_proto(session.current_position());
    end.set_exit_status(outcome->status);
    end.set_digest(full.bytes.data(), full.bytes.size());
    end.set_instructions(backend.instruction_count().value_or(0));
    end.set_reason(outcome->reason);
    trace::Footer footer;
    footer.set_final_digest(full.bytes.data(), full.bytes.size());
    footer.set_instructions(backend.instruction_count().value_or(0));
    footer.set_branches(backend.branch_count().value_or(0));
    footer.set_wall_ns(session.wall_ns());
    footer.set_exit_status(outcome->status);
    if (auto r = session.engine().finish_record(std::move(end), std::move(footer)); !r) return report_error(r.error());
    say("recorded {} events to {}", session.engine().events_processed(), options.trace_path);
  }
  return outcome->status;
}

std::string find_input(const trace::Header& h, const std::string& role, const trace::InputFile** out) {
  for (const auto& f : h.inputs()) {
    if (f.role() == role) {
      *out = &f;
      return f.path();
    }
  }
  *out = nullptr;
  return "";
}

// A recording whose RDTSC/RDRAND values are in the trace needs a backend that traps them, or the guest would
// read live values where the recording has events: refuse before running (stock KVM, DEJA_KVM_DEJA=off).
// Interp recordings always say "trapped", so the events are counted (a second pass over the trace, only on
// this path): a trace of a guest that never read the TSC replays anywhere.
Result<> check_rdtsc_replayable(const trace::Header& header, const Backend& backend, const std::string& path) {
  if (!header.config().rdtsc_trapped() || backend.traps_rdtsc()) return {};
  auto reader = TraceReader::open(path);
  if (!reader) return std::unexpected(reader.error());
  uint64_t trapped = 0;
  while (true) {
    auto event = (*reader)->next();
    if (!event || !*event) break;  // damage is reported by the replay itself, at its place
    if ((*event)->has_rdtsc() || (*event)->has_rdrand()) ++trapped;
  }
  if (trapped == 0) return {};
  return fail(ErrorKind::kUnsupported,
              "{} holds {} RDTSC/RDRAND values recorded on {}; the {} backend cannot hand them to the guest because "
              "{}: replay with --backend interp, or on KVM with the kvm-deja module loaded (docs/kvm-deja.md)",
              path, trapped, header.config().backend(), backend.name(), backend.rdtsc_untrapped_reason());
}

}  // namespace

int replay_trace(const ReplayOptions& options) {
  install_signal_handlers();
  auto reader = TraceReader::open(options.trace_path);
  if (!reader) {
    // A trace that cannot be opened is a bad argument, not a host failure.
    Error e = reader.error();
    if (e.kind == ErrorKind::kHost) e.kind = ErrorKind::kInvalidArgument;
    return report_error(e);
  }
  const trace::Header header = (*reader)->header();
  const auto& rc = header.config();

  if (header.cpu_model_version() != CpuModel::current().version()) {
    return report_error({ErrorKind::kUnsupported,
                         fmt::format("{} was recorded with CPU model v{}; this deja implements v{}",
                                     options.trace_path, header.cpu_model_version(), CpuModel::current().version())});
  }
  if (header.device_model_version() != kDeviceModelVersion) {
    return report_error({ErrorKind::kUnsupported,
                         fmt::format("{} was recorded with device model v{}; this deja implements v{}",
                                     options.trace_path, header.device_model_version(), kDeviceModelVersion)});
  }
  ProgressChoice progress;
  if (rc.progress_mode() == "exact") {
    progress.mode = ProgressMode::kExact;
  } else if (rc.progress_mode() == "exit-sync") {
    progress.mode = ProgressMode::kExitSync;
  } else {
    return report_error({ErrorKind::kUnsupported, fmt::format("{} uses progress mode '{}', which this deja cannot replay",
                                                              options.trace_path, rc.progress_mode())});
  }

  std::string backend = options.backend;
  if (backend.empty()) {
    backend = rc.backend();
    if (backend == "kvm" && access("/dev/kvm", R_OK | W_OK) != 0) {
      say("note: {} was recorded on KVM; this host has no usable /dev/kvm, replaying on the software CPU",
          options.trace_path);
      backend = "interp";
    }
  }
  if (!options.progress.empty()) {
    auto choice = parse_progress(options.progress);
    if (!choice) return report_error(choice.error());
    if (choice->mode != ProgressMode::kExact || progress.mode != ProgressMode::kExact) {
      return report_error({ErrorKind::kInvalidArgument,
                           fmt::format("--progress {}: {} was recorded in {} mode; replay can only choose the counter "
                                       "of an exact-mode trace (exact or emulated-pmu:SKID)",
                                       options.progress, options.trace_path, rc.progress_mode())});
    }
    progress = *choice;
  } else if (backend == "interp" && rc.progress_counter().starts_with("emulated-pmu:")) {
    // Replay a trace recorded with an emulated PMU the same way, so that its skid handling is exercised.
    auto choice = parse_progress(rc.progress_counter());
    if (choice) progress = *choice;
  }
  if (backend == "kvm" && progress.mode == ProgressMode::kExact) {
    PmuSelftest pmu = run_pmu_selftest();
    if (!pmu.usable()) {
      return report_error({ErrorKind::kUnsupported,
                           fmt::format("{} places interrupts at exact instruction coordinates (recorded with the {} "
                                       "counter); KVM on this host cannot reach them: {}; replay with --backend interp",
                                       options.trace_path, rc.progress_counter().empty() ? rc.backend()
                                                                                         : rc.progress_counter(),
                                       pmu.first_failure())});
    }
  }

  const trace::InputFile* image_entry = nullptr;
  std::string image_path = find_input(header, "image", &image_entry);
  if (!image_entry) return report_error({ErrorKind::kBadTrace, fmt::format("{} names no guest image", options.trace_path)});
  if (!options.image_path.empty()) image_path = options.image_path;
  LoadOptions load;
  load.cmdline = rc.cmdline();
  int module_index = 0;
  for (const auto& f : header.inputs()) {
    if (f.role() != "module") continue;
    load.modules.push_back({f.path(), module_index < rc.module_args_size() ? rc.module_args(module_index) : ""});
    ++module_index;
  }
  auto inputs = read_inputs(image_path, load);
  if (!inputs) return report_error(inputs.error());
  auto check_hash = [&](const trace::InputFile& f, const std::string& path, std::span<const uint8_t> bytes) -> Result<> {
    auto sha = sha256_bytes(bytes);
    if (std::string(reinterpret_cast<const char*>(sha.data()), sha.size()) != f.sha256()) {
      return fail(ErrorKind::kInvalidArgument,
                  "{} differs from the {} recorded in {}: its SHA-256 is {}, the recording's is {}", path, f.role(),
                  options.trace_path, hex(sha),
                  hex(std::span(reinterpret_cast<const uint8_t*>(f.sha256().data()), f.sha256().size())));
    }
    return {};
  };
  if (auto r = check_hash(*image_entry, image_path, inputs->image); !r) return report_error(r.error());
  module_index = 0;
  for (const auto& f : header.inputs()) {
    if (f.role() != "module") continue;
    if (auto r = check_hash(f, load.modules[module_index].path, inputs->modules[module_index]); !r) {
      return report_error(r.error());
    }
    ++module_index;
  }

  MachineConfig config;
  config.memory_bytes = rc.memory_bytes();
  config.cmdline = rc.cmdline();
  config.backend = backend;
  config.rtc_epoch_unix_seconds = header.start_unix_ns() / 1'000'000'000;
  config.device_semantics = rc.device_semantics();
  if (!options.test_device_semantics.empty()) config.device_semantics = options.test_device_semantics;
  config.trap_rdtsc = rc.rdtsc_trapped();

  Session session(Mode::kReplay, progress.mode);
  if (auto built = session.build(config, options.serial_out, inputs->image, image_path, load, inputs->modules);
      !built) {
    return report_error(built.error());
  }
  if (auto ok = check_rdtsc_replayable(header, session.machine().backend(), options.trace_path); !ok) {
    return report_error(ok.error());
  }
  if (auto r = session.setup_progress(progress); !r) return report_error(r.error());
  session.engine().attach_reader(std::move(*reader));
  Engine& engine = session.engine();

  auto outcome = session.run();
  if (!outcome) return report_error(outcome.error());

  if (outcome->status == exit_status::kInterrupted && !outcome->recorded_end) {
    say("replay interrupted after {} events", engine.events_processed());
    return exit_status::kInterrupted;
  }
  bool end_matched = false;
  std::optional<Digest> final_digest;
  if (outcome->status != exit_status::kDivergence && outcome->status != exit_status::kTraceEnded) {
    if (outcome->recorded_end) {
      // replay_end_here() matched the End of a recording that stopped here (interrupted, or stopped by deja).
      end_matched = engine.expect_end("the recording's end") != nullptr;
    } else if (const trace::End* end = engine.expect_end(fmt::format("the guest stopped: {}", outcome->reason))) {
      // The recording must end the same way, with the same state.
      end_matched = true;
      Digest full = session.final_machine_digest();
      final_digest = full;
      std::string got(reinterpret_cast<const char*>(full.bytes.data()), full.bytes.size());
      if (end->exit_status() != outcome->status) {
        engine.report_divergence("the guest's exit status differs", fmt::format("status {}", end->exit_status()),
                                 fmt::format("status {}", outcome->status));
      } else if (!end->digest().empty() && end->digest() != got) {
        engine.report_divergence(
            "the final machine state differs (registers, RAM or devices)",
            fmt::format("digest {}", hex(std::span(reinterpret_cast<const uint8_t*>(end->digest().data()),
                                                   end->digest().size()))),
            fmt::format("digest {}", full.hex()));
      }
      engine.check_output_complete();
    }
  }
  if (options.stats) session.print_stats();
  if (engine.divergence()) {
    std::fputs(("deja: " + engine.divergence()->report).c_str(), stderr);
    return exit_status::kDivergence;
  }
  if (!end_matched) {
    TraceReader* r = engine.reader();
    if (!engine.trace_error().empty()) {
      say("{}", engine.trace_error());
    } else {
      say("replayed the valid prefix of {}: {} events; {}", options.trace_path, engine.events_processed(),
          r ? r->end_description() : "end of trace");
    }
    return exit_status::kTraceEnded;
  }
  finish_outcome_message(*outcome);
  if (options.print_digest) say("digest {}", session.final_cpu_ram_digest().hex());
  // Everything up to the End event replayed; say so if the index after it is damaged or missing.
  engine.peek();
  if (TraceReader* r = engine.reader(); r && !r->complete()) {
    say("note: {} has no valid index after its last event ({}); `deja verify` reports it",
        options.trace_path, engine.trace_error().empty() ? r->end_description() : engine.trace_error());
  }
  if (!options.quiet) {
    auto instructions = session.machine().backend().instruction_count();
    say("replay OK: {} events, {} instructions, {}, exit status {}", engine.events_processed(),
        instructions ? fmt::format("{}", *instructions) : std::string("(not counted on kvm)"),
        final_digest ? "final state digest matches (" + final_digest->hex() + ")"
                     : std::string("stopped where the recording stopped"),
        outcome->status);
  }
  return outcome->status;
}


Result<ProgressChoice> parse_progress(const std::string& spec) {
  ProgressChoice c;
  if (spec == "exact") return c;
  if (spec == "exit-sync") {
    c.mode = ProgressMode::kExitSync;
    return c;
  }
  constexpr std::string_view kEmulated = "emulated-pmu:";
  if (spec.starts_with(kEmulated)) {
    std::string rest = spec.substr(kEmulated.size());
    std::string skid_text = rest.substr(0, rest.find(':'));
    auto number = [&](const std::string& text, const char* what) -> Result<uint64_t> {
      uint64_t v = 0;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
        return fail(ErrorKind::kInvalidArgument, "--progress {}: the {} '{}' is not a non-negative integer", spec,
                    what, text);
      }
      return v;
    };
    auto skid = number(skid_text, "skid");
    if (!skid) return std::unexpected(skid.error());
    c.emulated_skid = *skid;
    if (rest.find(':') != std::string::npos) {
      auto seed = number(rest.substr(rest.find(':') + 1), "seed");
      if (!seed) return std::unexpected(seed.error());
      c.emulated_seed = *seed;
    }
    return c;
  }
  return fail(ErrorKind::kInvalidArgument,
              "--progress '{}' is not one of exact, exit-sync, emulated-pmu:SKID or emulated-pmu:SKID:SEED", spec);
}

int run_guest(const SessionOptions& options) { return run_or_record(options, Mode::kRun); }
int record_guest(const SessionOptions& options) { return run_or_record(options, Mode::kRecord); }

}  // namespace deja
