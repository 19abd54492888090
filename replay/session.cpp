// The run loop shared by run, record and replay: exits go to the bus through the engine's choke points.
#include "replay/session.h"

#include <poll.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <random>

#include <fmt/format.h>

#include "interp/interp_backend.h"
#include "kvm/pmu.h"
#include "logging/trace_inspect.h"
#include "core/cpu_model.h"
#include "core/exit_status.h"
#include "core/messages.h"
#include "devices/state_codec.h"
#include "snapshot/cpu_state_codec.h"

namespace deja {
namespace {

std::atomic<bool> g_stop_requested{false};
std::atomic<Backend*> g_kick_target{nullptr};

void on_stop_signal(int) {
  g_stop_requested.store(true);
  if (Backend* b = g_kick_target.load()) b->kick();
}

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


}  // namespace

void install_stop_signal_handlers() {
  g_stop_requested.store(false);
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// Serial output goes to the user's sink and, through the engine, into the trace.
class Session::TeeSink : public ByteSink {
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


Session::Session(Mode mode, ProgressMode progress) : engine_(mode, progress) {}
Session::~Session() = default;

Result<> Session::build(const MachineConfig& config, const std::string& serial_out, std::span<const uint8_t> image,
                        const std::string& image_name, const LoadOptions& load,
                        std::span<const std::vector<uint8_t>> modules, std::span<const uint8_t> initrd) {
  auto sink = FileSink::open(serial_out);
  if (!sink) return std::unexpected(sink.error());
  out_ = std::move(*sink);
  tee_ = std::make_unique<TeeSink>(*out_, engine_);
  auto machine = Machine::create(config, engine_, *tee_, &engine_, &engine_);
  if (!machine) return std::unexpected(machine.error());
  machine_ = std::move(*machine);
  LoadOptions options = load;
  options.cpu_has_nx = config.cpu_model->has(feature("NX"));
  auto loaded = load_guest_image_bytes(machine_->memory(), image, image_name, options, modules, initrd);
  if (!loaded) return std::unexpected(loaded.error());
  image_format_ = loaded->format;
  if (auto s = machine_->backend().set_state(loaded->initial_state); !s) return std::unexpected(s.error());
  engine_.set_position_source([this] { return position(); });
  return {};
}

std::string Session::counter_description() {
  ProgressCounter* c = machine_->backend().progress_counter();
  return c ? c->describe() : std::string();
}

uint64_t Session::serial_bytes() const { return tee_ ? tee_->bytes() : 0; }

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
    case ExitKind::kRdtsc:
    case ExitKind::kRdrand:
      return rdtsc_exits_are_guest_exits_;
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

Result<> Session::derive_time(Engine::TimeRates rates) {
  Backend& cpu = machine_->backend();
  if (!cpu.instruction_count()) {
    return fail(ErrorKind::kUnsupported, "the {} backend does not count instructions, from which this time follows",
                cpu.name());
  }
  engine_.derive_time(rates, [&cpu] { return cpu.instruction_count(); });
  derived_time_cpu_ = dynamic_cast<InterpBackend*>(&cpu);
  return {};
}

Result<CpuState> Session::comparable_state() {
  auto st = machine_->backend().get_state();
  // KVM has finished an MMIO-writing instruction when it exits, the software CPU finishes it when it runs again.
  // For a plain store (what MMIO writes are) the RIP is all that differs: take the exit's, the next instruction.
  if (st && mmio_write_exits_complete_ && after_mmio_write_) st->rip = last_exit_rip_;
  return st;
}

Position Session::position() {
  Position p;
  p.guest_exits = guest_exits_;
  p.instructions = machine_->backend().instruction_count();
  if (engine_.progress() == ProgressMode::kExitSync) {
    // Exit-synchronous coordinates: the n-th guest-caused exit and the instruction that caused it.
    p.at.rip = last_exit_rip_;
    return p;
  }
  auto st = comparable_state();
  if (st) {
    p.at.rip = st->rip;
    p.at.rcx = st->gpr[kRcx];
    p.gpr_digest = gpr_digest(*st);
  }
  p.at.branches = machine_->backend().branch_count().value_or(0);
  return p;
}

void Session::apply_async(uint64_t now_ns, std::span<const uint8_t> input, std::span<const FrameIn> frames) {
  engine_.begin_async(now_ns);
  machine_->advance_devices(now_ns);
  if (!input.empty()) machine_->uart().receive(input);
  // Each NIC takes its frames in their recorded order (a frame for a NIC this machine lacks is dropped).
  const auto& nics = machine_->nics();
  for (size_t nic = 0; nic < nics.size() && !frames.empty(); ++nic) {
    std::vector<std::span<const uint8_t>> mine;
    for (const FrameIn& f : frames) {
      if (f.nic == nic) mine.push_back(f.data);
    }
    if (!mine.empty()) nics[nic]->receive(mine);
  }
  engine_.end_async();
}

// Run / record: poll the NICs' user-mode networks (at most every kNetPollNs of host time: a poll(2) per exit would
// cost more than the exits) and take the frames waiting for them, as many as each NIC has receive buffers for.
std::vector<NetFrameIn> Session::take_network_frames() {
  std::vector<NetFrameIn> frames;
  auto& networks = engine_.networks();
  if (networks.empty()) return frames;
  const uint64_t host_now = HostClock::monotonic_ns();
  if (host_now >= next_net_poll_ns_) {
    for (auto& n : networks) n->poll_now();
    next_net_poll_ns_ = host_now + kNetPollNs;
  }
  const auto& nics = machine_->nics();
  for (size_t i = 0; i < networks.size() && i < nics.size(); ++i) {
    const size_t waiting = std::min<size_t>(networks[i]->pending(), kMaxFramesPerEvent);
    if (waiting == 0) continue;
    const size_t room = std::min<size_t>(waiting, nics[i]->rx_capacity());
    for (auto& f : networks[i]->take(room)) frames.push_back(NetFrameIn{unsigned(i), std::move(f)});
  }
  return frames;
}

// Whether something outside the vCPU is due now (a device deadline, frames a NIC can take): recording in exact
// mode then stops the vCPU at the next instruction boundary to let it in, rather than at the next timer tick.
bool Session::async_work_due() {
  auto deadline = machine_->next_deadline_ns();
  if (deadline && *deadline <= engine_.running_now_ns()) return true;
  auto& networks = engine_.networks();
  const auto& nics = machine_->nics();
  for (size_t i = 0; i < networks.size() && i < nics.size(); ++i) {
    if (networks[i]->pending() > 0 && nics[i]->rx_capacity() > 0) return true;
  }
  return false;
}

// Run / record: let host time and host input into the machine, if anything is due.
void Session::poll_async(bool idle) {
  uint64_t now = idle ? engine_.host_now_ns() : engine_.running_now_ns();
  auto deadline = machine_->next_deadline_ns();
  bool due = deadline && *deadline <= now;
  uint8_t buf[256];
  size_t n = 0;
  if (input_ && !input_->at_end()) {
    size_t space = std::min(machine_->uart().rx_space(), sizeof(buf));
    if (space > 0) n = input_->read_available(std::span(buf, space));
  }
  std::vector<NetFrameIn> frames = take_network_frames();
  if (!due && n == 0 && frames.empty()) return;
  if (engine_.mode() == Mode::kRecord) engine_.record_async(position(), now, std::span(buf, n), frames);
  std::vector<FrameIn> views;
  for (const NetFrameIn& f : frames) views.push_back(FrameIn{f.nic, f.data});
  apply_async(now, std::span(buf, n), views);
}

// Replay: apply every recorded async event (and check every heartbeat) that lands exactly here.
void Session::replay_async() {
  while (const trace::Event* e = engine_.next_positional()) {
    Position here = position();
    if (!engine_.positional_matches(*e, here)) {
      // In exact mode the backend stops on the coordinate, so being past it means divergence.
      const trace::Coordinate& at = engine_.positional_at(*e);
      // Branches and guest exits only grow: past either (or, at equal counts, past the recorded
      // instruction count of a heartbeat) means the guest went by the event's place.
      bool passed = engine_.progress() == ProgressMode::kExact
                        ? here.at.branches > at.branches() ||
                              (here.at.branches == at.branches() &&
                               (here.guest_exits > at.guest_exits() ||
                                (here.guest_exits == at.guest_exits() && here.instructions &&
                                 Engine::positional_instructions(*e) != 0 &&
                                 *here.instructions > Engine::positional_instructions(*e))))
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
      std::vector<FrameIn> frames;
      for (const auto& f : a.net_frames()) {
        frames.push_back(FrameIn{f.nic(), std::span(reinterpret_cast<const uint8_t*>(f.data().data()), f.data().size())});
      }
      apply_async(a.now_ns(),
                  std::span(reinterpret_cast<const uint8_t*>(a.serial_input().data()), a.serial_input().size()),
                  frames);
    }
  }
}

Result<> Session::deliver_interrupts() {
  Backend& cpu = machine_->backend();
  if (!machine_->interrupts().interrupt_pending()) {
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
  uint8_t vector = machine_->interrupts().acknowledge();
  engine_.interrupt(vector, position());
  cpu.request_interrupt_window(false);
  last_exit_kind_ = ExitKind::kKicked;  // one injection per exit
  return cpu.inject_interrupt(vector);
}

void Session::maybe_digest() {
  if (engine_.mode() == Mode::kRun || engine_.events_processed() < next_digest_at_) return;
  next_digest_at_ = engine_.events_processed() + digest_interval_;
  auto st = comparable_state();
  DigestParts parts;
  Digest d = machine_digest(st ? *st : CpuState{}, machine_->memory(), machine_->device_states(), &parts);
  std::vector<std::string> names;
  for (const auto& part : machine_->stateful_parts()) names.push_back(part.name);
  engine_.record_digest(position(), d, machine_->backend().instruction_count().value_or(0), parts, names);
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

// HLT in run/record: sleep (in host time) until a device event, input or a network packet can wake the guest.
Result<std::optional<Outcome>> Session::wait_for_wake() {
  auto& networks = engine_.networks();
  for (;;) {
    if (machine_->interrupts().interrupt_pending()) return std::nullopt;
    if (g_stop_requested.load()) return std::nullopt;
    if (!engine_.host_error().empty()) return std::nullopt;
    auto deadline = machine_->next_deadline_ns();
    bool input_open = input_ && !input_->at_end();
    if (!deadline && !input_open && networks.empty()) {
      return Outcome{exit_status::kGuestStopped, "the guest halted with no timer armed and no input attached", false};
    }
    uint64_t now = engine_.host_now_ns();
    std::vector<pollfd> fds{pollfd{input_open ? input_->fd() : -1, POLLIN, 0}};
    int timeout_ms = 100;
    if (deadline) {
      timeout_ms = *deadline <= now ? 0 : int(std::min<uint64_t>((*deadline - now + 999'999) / 1'000'000, 100));
    }
    for (auto& n : networks) n->add_fds(fds, &timeout_ms);
    int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    for (auto& n : networks) n->dispatch(fds, ready < 0);
    next_net_poll_ns_ = HostClock::monotonic_ns() + kNetPollNs;
    poll_async(true);
  }
}

std::optional<Outcome> Session::replay_end_here() {
  const trace::Event* e = engine_.peek();
  if (!e || e->kind_case() != trace::Event::kEnd) return std::nullopt;
  const auto& end = e->end();
  if (end.reason() == "guest exit") return std::nullopt;  // reached through the guest's own exit port write
  // The whole coordinate, guest exits included; whether the guest really got there (instructions,
  // state, output) is check_replay_end()'s question.
  const Position here = position();
  if (!same_coordinate(end.at(), here, engine_.progress())) return std::nullopt;
  if (engine_.progress() == ProgressMode::kExact && end.instructions() != 0 && here.instructions &&
      *here.instructions < end.instructions()) {
    // An earlier visit of the End's coordinate (a loop that neither branches nor changes a register:
    // `1: incq mem; jmp 1b`): the seeker, whose target is the End, stops at the visit with the recorded
    // instruction count.
    return std::nullopt;
  }
  if (engine_.progress() == ProgressMode::kExitSync && end.instructions() != 0 && here.instructions &&
      *here.instructions < end.instructions()) {
    // Exit-sync on the software CPU: the recording stopped between guest exits (interrupted, or a
    // spin stopped by deja), which the coordinate cannot place; the instruction count can.
    if (auto* interp = dynamic_cast<InterpBackend*>(&machine_->backend())) {
      interp->set_instruction_budget(end.instructions() - *here.instructions);
      return std::nullopt;
    }
  }
  return Outcome{end.exit_status(), end.reason(), false, true};
}

Digest Session::check_replay_end(const trace::End& end, const Outcome& outcome) {
  Digest full = final_machine_digest();
  const Position here = position();
  const std::string got(reinterpret_cast<const char*>(full.bytes.data()), full.bytes.size());
  if (end.exit_status() != outcome.status) {
    engine_.report_divergence("the guest's exit status differs", fmt::format("status {}", end.exit_status()),
                              fmt::format("status {}", outcome.status));
  } else if (end.at().guest_exits() != here.guest_exits) {
    engine_.report_divergence("the guest made a different number of exits (port I/O, MMIO, HLT, MSR) by the end",
                              fmt::format("{} guest exits", end.at().guest_exits()),
                              fmt::format("{} guest exits", here.guest_exits));
  } else if (instructions_differ(end.instructions(), here)) {
    engine_.report_divergence("the guest retired a different number of instructions by the end",
                              fmt::format("{} instructions", end.instructions()),
                              fmt::format("{} instructions", *here.instructions));
  } else if (!end.digest().empty() && end.digest() != got) {
    engine_.report_divergence("the final machine state differs (registers, RAM or devices)",
                              fmt::format("digest {}", hex(end.digest())), fmt::format("digest {}", full.hex()));
  }
  engine_.check_output_complete();
  return full;
}

Result<std::optional<Outcome>> Session::handle_exit(VcpuExit& exit) {
  ++exit_counts_[exit.kind];
  last_exit_kind_ = exit.kind;
  after_mmio_write_ = exit.kind == ExitKind::kMmioWrite;
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
      // Outside the vCPU deja emulates the TSC and the MSRs of the machine's devices (the local
      // APIC's on pc-apic); every other one is #GP, as on a CPU that lacks it.
      if (exit.msr == msr::kTsc) {
        exit.value = engine_.msr_read(exit.msr, exit.rip, engine_.mode() == Mode::kReplay ? 0 : engine_.tsc_now());
        exit.fault = false;
      } else if (auto device = machine_->read_msr(exit.msr)) {
        auto [value, fault] = engine_.device_msr_read(exit.msr, device->value, device->fault, exit.rip);
        exit.value = value;
        exit.fault = fault;
      } else {
        exit.fault = true;
      }
      break;
    case ExitKind::kMsrWrite:
      exit.fault = !machine_->write_msr(exit.msr, exit.value).value_or(false);
      break;
    case ExitKind::kHlt: {
      auto st = machine_->backend().get_state();
      if (!st) return std::unexpected(st.error());
      if (!(st->rflags & rflags::kIf) && !machine_->interrupts().interrupt_pending()) {
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
  else g_kick_target.store(&cpu);  // SIGINT/SIGTERM stop a replay too, even one the seeker is stepping
  struct KickerGuard {
    Session* s;
    ~KickerGuard() { s->stop_kicker(); }
  } guard{this};

  for (;;) {
    tick_progress();
    if (mode == Mode::kReplay) {
      replay_async();
      if (auto end = replay_end_here()) return *end;
      // Recording takes a due digest right after the asynchronous event that made it due, before the
      // interrupt that event may raise is delivered; replay consumes that event only here, so check here too.
      maybe_digest();
    }
    if (engine_.divergence()) return Outcome{exit_status::kDivergence, "divergence", false};
    if (mode == Mode::kReplay && engine_.replay_exhausted() && !engine_.peek()) {
      return Outcome{exit_status::kTraceEnded, "end of trace", false};
    }
    if (g_stop_requested.load()) return Outcome{exit_status::kInterrupted, "interrupted", false};
    // A full disk or a file-size limit stops the run at once, as a host failure, rather than letting
    // the guest run on with its trace or its output lost.
    if (!engine_.write_error().empty()) return fail(ErrorKind::kHost, "{}", engine_.write_error());
    if (!engine_.host_error().empty()) return fail(ErrorKind::kHost, "{}", engine_.host_error());
    if (out_ && !out_->error().empty()) return fail(ErrorKind::kHost, "{}", out_->error());
    if (auto r = deliver_interrupts(); !r) return std::unexpected(r.error());
    // A digest an interrupt event made due is taken here, before the vCPU runs: where the run after an
    // injection stops (a kick in recording, the next exit in replay) differs between the two.
    maybe_digest();

    if (seeker_) {
      std::optional<SeekTarget> target;
      if (const trace::Event* next = engine_.peek()) {
        const trace::Coordinate* at = nullptr;
        uint64_t instructions = 0;  // recorded with heartbeats, the End and derived-TSC async events (0: not counted)
        if (engine_.next_positional()) {
          at = &engine_.positional_at(*next);
          instructions = Engine::positional_instructions(*next);
        }
        if (next->kind_case() == trace::Event::kEnd && next->end().reason() != "guest exit") {
          at = &next->end().at();
          instructions = next->end().instructions();
        }
        if (at) {
          target = SeekTarget{Coordinate{at->vcpu(), at->branches(), at->rip(), at->rcx()}, at->gpr_digest(),
                              [this, exits = at->guest_exits(), instructions] {
                                auto n = machine_->backend().instruction_count();
                                const bool counted = instructions != 0 && n;
                                if (guest_exits_ > exits || (counted && *n > instructions)) return Visit::kLater;
                                if (guest_exits_ < exits || (counted && *n < instructions)) return Visit::kEarlier;
                                return Visit::kTarget;
                              },
                              instructions};
        }
      }
      seeker_->set_target(target);
    } else if (mode != Mode::kReplay) {
      auto deadline = machine_->next_deadline_ns();
      uint64_t kick = deadline ? engine_.host_origin_ns() + *deadline : UINT64_MAX;
      if (derived_time_cpu_) {
        // Derived time: the device is due where virtual time reaches its deadline, an instruction count away.
        derived_time_cpu_->set_instruction_budget(deadline ? engine_.instructions_until(*deadline) : 0);
        kick = UINT64_MAX;
      }
      if (input_ && !input_->at_end()) kick = std::min(kick, HostClock::monotonic_ns() + 10'000'000);
      // The NICs' host sockets are polled from the vCPU thread: at least every millisecond.
      if (!engine_.networks().empty()) kick = std::min(kick, HostClock::monotonic_ns() + kNetPollNs);
      if (mode == Mode::kRecord) kick = std::min(kick, next_heartbeat_);
      kick_at_.store(kick);
    }

    if (mode == Mode::kReplay && !exact) {
      // An interrupted exit-sync recording can end right after an interrupt was delivered, before
      // the handler's first instruction (the stop kicked the vCPU as it entered): the backend then
      // delivers what was injected and returns, as it did when recording.
      const trace::Event* next = engine_.peek();
      if (next && next->kind_case() == trace::Event::kEnd && next->end().reason() != "guest exit") {
        const Position here = position();
        if (same_coordinate(next->end().at(), here, engine_.progress()) &&
            !instructions_differ(next->end().instructions(), here)) {
          cpu.kick();
        }
      }
    }
    auto exit = seeker_ ? seeker_->run() : cpu.run();
    if (!exit) return std::unexpected(exit.error());
    auto done = handle_exit(**exit);
    if (!done) return std::unexpected(done.error());
    if (*done) {
      wall_ns_ = HostClock::monotonic_ns() - started;
      if (out_ && !out_->error().empty()) return fail(ErrorKind::kHost, "{}", out_->error());
      return **done;
    }
    if (engine_.divergence()) continue;
    // Replay applies the events recorded right after this exit here too, before the digest check
    // below, as recording did (not at the top of the next iteration, after the next exit).
    if (mode == Mode::kReplay) replay_async();

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
        if (!machine_->interrupts().interrupt_pending() && !engine_.divergence() && engine_.peek()) {
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
    // What the recording let in after this exit (async events, heartbeats) precedes the digest it took
    // at the end of this iteration. The check at the top of the loop covers an async event that made
    // the digest due; this one an exit's own events that did (exit-sync: a port read, then the async
    // polled after it, then the digest), where checking before the async would find it first.
    if (mode == Mode::kReplay) replay_async();
    maybe_digest();
    // A device that became due during this exit (a virtio notification) or frames a NIC can now take: stop
    // at the next instruction boundary to let them in.
    if (mode == Mode::kRecord && exact && async_work_due()) cpu.kick();
  }
}

void Session::print_stats() {
  say("backend {} with CPU model {}", machine_->backend().name(), machine_->config().cpu_model->name());
  say("exits by kind:");
  for (const auto& [kind, count] : exit_counts_) say("  {:<20} {}", exit_kind_name(kind), count);
  if (auto n = machine_->backend().instruction_count()) say("instructions retired: {}", *n);
  if (auto n = machine_->backend().branch_count()) say("conditional branches retired: {}", *n);
  if (seeker_) {
    const auto& st = seeker_->stats();
    say("coordinate seeking ({}, skid {}): {} reached, {} counter overflows, {} breakpoint hits, {} single steps, "
        "{} runs to an instruction count",
        counter_description(), machine_->backend().progress_counter()->skid(), st.reached, st.overflows,
        st.breakpoint_hits, st.single_steps, st.skips);
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
  // Past the first Bus::kUnknownSample addresses only totals are kept.
  for (const Bus* bus : {&machine_->pio(), &machine_->mmio()}) {
    const auto& rest = bus->unknown_unsampled();
    if (rest.reads + rest.writes > 0) {
      say("  {} more unknown {} accesses ({} reads, {} writes) at addresses beyond the first {} listed",
          rest.reads + rest.writes, bus->name(), rest.reads, rest.writes, Bus::kUnknownSample);
    }
  }
  if (PciHost* pci = machine_->pci()) {
    for (const auto& function : machine_->virtio_functions()) {
      say("{} at 00:{:02x}.0, IRQ {}, status {:#04x}{}", function->name(), function->slot(),
          pci->irq_of(function->slot()), function->status(),
          function->error_count() ? fmt::format(", needed reset {} times, last: {}", function->error_count(),
                                                function->last_error())
                                  : std::string());
    }
    for (const auto& nic : machine_->nics()) {
      const auto& c = nic->counters();
      say("  {}: sent {} frames ({} bytes, {} dropped), received {} frames ({} bytes, {} dropped)", nic->name(),
          c.tx_frames, c.tx_bytes, c.tx_dropped, c.rx_frames, c.rx_bytes, c.rx_dropped);
    }
    for (const auto& disk : disks_) {
      say("  disk {}: {} bytes read, {} bytes written", disk->path(), disk->bytes_read(), disk->bytes_written());
    }
    if (pci->refused_mappings()) say("  {} BAR placements overlapped other devices", pci->refused_mappings());
  }
  if (auto* interp = dynamic_cast<const InterpBackend*>(&machine_->backend())) {
    const InterpBackend::FastStats fast = interp->fast_stats();
    say("interp executor: {}", interp_mode_name(interp->mode()));
    if (interp->mode() != InterpMode::kReference) {
      say("  blocks translated {}, entered {} (chained by lookup {}), instructions left to the reference executor {}",
          fast.blocks_translated, fast.blocks_entered, fast.chained, fast.fallback_steps);
      say("  blocks dropped by code writes {}, cache flushes {}, cache bytes {}", fast.block_invalidations,
          fast.block_cache_flushes, fast.block_cache_bytes);
    }
    auto counts = interp->unimplemented_counts();
    if (counts.empty()) {
      say("unimplemented instructions: none executed");
    } else {
      say("unimplemented instructions (raised #UD in the guest):");
      for (const auto& [mnemonic, count] : counts) say("  {:<16} {}", mnemonic, count);
    }
  }
}

// ---- the steppable replay ------------------------------------------------------------------------

Result<> Session::apply_debug(const DebugControl& control) {
  if (seeker_) {
    seeker_->set_user_debug(control);
    return {};
  }
  if (applied_debug_ && *applied_debug_ == control) return {};
  if (auto r = machine_->backend().set_debug(control); !r) return r;
  applied_debug_ = control;
  return {};
}

bool Session::completes_on_next_run(ExitKind kind) {
  switch (kind) {
    case ExitKind::kIoIn:
    case ExitKind::kIoOut:
    case ExitKind::kMmioRead:
    case ExitKind::kMmioWrite:
    case ExitKind::kMsrRead:
    case ExitKind::kMsrWrite:
    case ExitKind::kRdtsc:
    case ExitKind::kRdrand:
      return true;
    default:
      return false;
  }
}

Result<StopReason> Session::run_until(const StopRequest& stop) {
  DEJA_ASSERT(engine_.mode() == Mode::kReplay, "run_until drives replays only");
  if (ended_) return StopReason{StopReason::Kind::kEnd, 0, WatchKind::kWrite, 0, *ended_};
  Backend& cpu = machine_->backend();
  auto* interp = dynamic_cast<InterpBackend*>(&cpu);
  const uint64_t start_step = cpu.step_count().value_or(0);
  std::optional<StopReason> watch_stop;
  auto linear_rip = [&]() -> std::optional<uint64_t> {
    auto st = cpu.get_state();
    if (!st) return std::nullopt;
    const bool code64 = (st->efer & efer::kLma) && st->cs.l;
    return code64 ? st->rip : (st->cs.base + st->rip) & 0xffffffffu;
  };
  auto finish = [&](Outcome o) -> StopReason {
    ended_ = o;
    return StopReason{StopReason::Kind::kEnd, 0, WatchKind::kWrite, 0, o};
  };
  DebugControl user;
  user.watchpoints = stop.watchpoints;
  for (;;) {
    tick_progress();
    // Every stop is decided here, at the same point of every iteration (so that stepping, seeking and a
    // checkpoint restore reach the same state), and only between instructions: right after an I/O, MMIO, MSR, RDTSC or RDRAND exit the instruction is
    // still to be completed by the next run(), so a stop due then takes one more step first.
    const uint64_t step = cpu.step_count().value_or(0);
    const bool between_instructions = !completes_on_next_run(last_exit_kind_);
    std::optional<StopReason> due;
    bool step_over = false;
    if (watch_stop) {
      due = watch_stop;
    } else if (stop.at_step && step >= *stop.at_step) {
      due = StopReason{StopReason::Kind::kStep};
    } else if (stop.at_event && engine_.events_processed() >= *stop.at_event) {
      due = StopReason{StopReason::Kind::kEvent};
    } else if (!stop.breakpoints.empty() && between_instructions) {
      auto rip = linear_rip();
      if (rip && std::find(stop.breakpoints.begin(), stop.breakpoints.end(), *rip) != stop.breakpoints.end()) {
        if (step != start_step || !cpu.step_count() || stop.stop_at_start_breakpoint) {
          due = StopReason{StopReason::Kind::kBreakpoint};
        } else {
          step_over = true;  // started on a breakpoint: leave it with one step
        }
      }
    }
    if (!due && ((stop.interrupted && stop.interrupted()) || g_stop_requested.load())) {
      due = StopReason{StopReason::Kind::kInterrupted};
    }
    if (due && between_instructions) return *due;
    const bool finish_instruction = due.has_value();

    replay_async();
    if (auto end = replay_end_here()) return finish(*end);
    maybe_digest();  // as run(): a digest due after the asynchronous events that land here
    if (engine_.divergence()) return finish(Outcome{exit_status::kDivergence, "divergence", false});
    if (engine_.replay_exhausted() && !engine_.peek()) {
      return finish(Outcome{exit_status::kTraceEnded, "end of trace", false});
    }
    if (auto r = deliver_interrupts(); !r) return std::unexpected(r.error());
    maybe_digest();  // as run(): a digest an interrupt event made due, before the vCPU runs
    if (engine_.divergence()) continue;

    user.breakpoints = step_over || finish_instruction ? std::vector<uint64_t>{} : stop.breakpoints;
    user.stop_at_step = stop.at_step;
    if (step_over) user.stop_at_step = std::min(stop.at_step.value_or(UINT64_MAX), step + 1);
    user.single_step = finish_instruction;
    if (auto r = apply_debug(user); !r) return std::unexpected(r.error());
    if (seeker_) {
      std::optional<SeekTarget> target;
      if (const trace::Event* next = engine_.peek()) {
        const trace::Coordinate* at = nullptr;
        if (engine_.next_positional()) at = &engine_.positional_at(*next);
        if (next->kind_case() == trace::Event::kEnd && next->end().reason() != "guest exit") at = &next->end().at();
        if (at) target = SeekTarget{Coordinate{at->vcpu(), at->branches(), at->rip(), at->rcx()}, at->gpr_digest()};
      }
      seeker_->set_target(target);
    }
    // A slice of about a million instructions, so that an interrupt request is seen in a long run.
    if (interp && stop.interrupted) interp->set_instruction_budget(1u << 20);

    auto exit = seeker_ ? seeker_->run() : cpu.run();
    if (!exit) return std::unexpected(exit.error());
    auto done = handle_exit(**exit);
    if (!done) return std::unexpected(done.error());
    if (*done) return finish(**done);
    if ((*exit)->kind == ExitKind::kDebug && (*exit)->watch_hit) {
      watch_stop = StopReason{StopReason::Kind::kWatchpoint, (*exit)->address, WatchKind((*exit)->watch_kind),
                              (*exit)->rip};
    }
    if (engine_.divergence()) continue;
    if ((*exit)->kind == ExitKind::kHlt) {
      replay_async();
      if (auto end = replay_end_here()) return finish(*end);
      if (!machine_->interrupts().interrupt_pending() && !engine_.divergence() && engine_.peek()) {
        engine_.report_divergence("the guest halted, but the recording has no event to wake it here",
                                  describe_event(*engine_.peek()), "HLT");
      }
    }
    // As run(): what the recording let in after this exit precedes the digest of this iteration.
    replay_async();
    maybe_digest();
  }
}

CheckpointPosition Session::checkpoint_position() {
  Backend& cpu = machine_->backend();
  CheckpointPosition at;
  at.steps = cpu.step_count().value_or(0);
  at.events = engine_.events_processed();
  at.branches = cpu.branch_count().value_or(0);
  at.guest_exits = guest_exits_;
  at.instructions = cpu.instruction_count().value_or(0);
  return at;
}

namespace {
void put_string(StateWriter& w, const std::string& s) {
  w.u32(uint32_t(s.size()));
  w.bytes(std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}
std::string get_string(StateReader& r) {
  uint32_t n = r.u32();
  if (n > (64u << 20)) {
    r.invalid("string longer than 64 MiB");
    return {};
  }
  std::string s(n, '\0');
  r.bytes(std::span(reinterpret_cast<uint8_t*>(s.data()), n));
  return s;
}
}  // namespace

// The run loop's own state and the engine's trace cursor ("SESS" section of a checkpoint).
Result<std::vector<uint8_t>> Session::encode_loop_state() const {
  auto cursor = engine_.save_cursor();
  if (!cursor) return std::unexpected(cursor.error());
  const Engine::Cursor& c = *cursor;
  StateWriter w("SESS", 3);
  w.u64(guest_exits_);
  w.u8(uint8_t(last_exit_kind_));
  w.u64(last_exit_rip_);
  w.boolean(after_mmio_write_);
  w.u64(next_digest_at_);
  w.u64(c.raw_position);
  w.boolean(c.has_lookahead);
  w.u8(uint8_t(c.output.ahead));
  put_string(w, c.output.pending);
  w.u64(c.output.matched);
  w.u64(c.events);
  w.u64(c.last_now);
  for (uint64_t v : {c.device_reads, c.anchor_ns, c.anchor_instructions, c.anchor_device_reads, c.last_ns, c.last_tsc}) {
    w.u64(v);
  }
  w.u32(uint32_t(c.recent.size()));
  for (const auto& line : c.recent) put_string(w, line);
  return w.take();
}

Result<> Session::decode_loop_state(std::span<const uint8_t> blob) {
  StateReader r(blob, "SESS", 3);
  uint64_t guest_exits = r.u64();
  uint8_t kind = r.u8();
  uint64_t last_rip = r.u64();
  bool after_mmio_write = r.boolean();
  uint64_t next_digest = r.u64();
  Engine::Cursor c;
  c.raw_position = r.u64();
  c.has_lookahead = r.boolean();
  uint8_t ahead = r.u8();
  if (ahead > 1) r.invalid("serial-output side out of range");
  c.output.ahead = StreamMatch::Side(ahead);
  c.output.pending = get_string(r);
  c.output.matched = r.u64();
  c.events = r.u64();
  c.last_now = r.u64();
  for (uint64_t* v : {&c.device_reads, &c.anchor_ns, &c.anchor_instructions, &c.anchor_device_reads, &c.last_ns,
                      &c.last_tsc}) {
    *v = r.u64();
  }
  uint32_t recent = r.u32();
  if (recent > 64) r.invalid("too many recent events");
  for (uint32_t i = 0; i < recent && r.ok(); ++i) c.recent.push_back(get_string(r));
  if (kind > uint8_t(ExitKind::kFault)) r.invalid("exit kind out of range");
  if (auto done = r.finish(); !done) return done;
  if (auto moved = engine_.restore_cursor(c); !moved) return moved;
  guest_exits_ = guest_exits;
  last_exit_kind_ = ExitKind(kind);
  last_exit_rip_ = last_rip;
  after_mmio_write_ = after_mmio_write;
  next_digest_at_ = next_digest;
  return {};
}

Result<MachineCheckpoint> Session::capture_checkpoint(CheckpointMemory& memory) {
  if (engine_.divergence()) return fail(ErrorKind::kDivergence, "no checkpoint of a replay that diverged");
  if (ended_) return fail(ErrorKind::kInvalidArgument, "no checkpoint at the end of the replay ({})", ended_->reason);
  Backend& cpu = machine_->backend();
  MachineCheckpoint cp;
  cp.at = checkpoint_position();
  auto st = cpu.get_state();
  if (!st) return std::unexpected(st.error());
  cp.cpu = encode_cpu_state(*st);
  cp.backend = cpu.save_internal();
  for (const auto& part : machine_->stateful_parts()) cp.devices.emplace_back(part.name, part.save());
  auto loop = encode_loop_state();
  if (!loop) return std::unexpected(loop.error());
  cp.session = std::move(*loop);
  auto image = memory.capture();
  if (!image) return std::unexpected(image.error());
  cp.memory = *image;
  return cp;
}

Result<> Session::restore_checkpoint(const MachineCheckpoint& cp, CheckpointMemory& memory) {
  Backend& cpu = machine_->backend();
  auto st = decode_cpu_state(cp.cpu);
  if (!st) return std::unexpected(st.error());
  const auto& parts = machine_->stateful_parts();
  if (cp.devices.size() != parts.size()) {
    return fail(ErrorKind::kInvalidArgument, "the checkpoint holds {} devices, this machine has {}", cp.devices.size(),
                parts.size());
  }
  std::vector<std::vector<uint8_t>> states;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (cp.devices[i].first != parts[i].name) {
      return fail(ErrorKind::kInvalidArgument, "the checkpoint's device {} is '{}', this machine's is '{}'", i,
                  cp.devices[i].first, parts[i].name);
    }
    states.push_back(cp.devices[i].second);
  }
  if (auto r = decode_loop_state(cp.session); !r) return r;
  if (auto r = machine_->restore_device_states(states); !r) return r;
  if (auto r = memory.restore(cp.memory); !r) return std::unexpected(r.error());
  if (auto r = cpu.set_state(*st); !r) return r;
  if (auto r = cpu.restore_internal(cp.backend); !r) return r;
  if (ProgressCounter* counter = cpu.progress_counter()) {
    if (auto r = counter->rebase(cp.at.branches); !r) return r;
  }
  if (seeker_) {
    if (auto r = seeker_->reset(); !r) return r;
  }
  applied_debug_.reset();
  ended_.reset();
  return {};
}

}  // namespace deja
