// The run loop shared by run, record and replay: exits go to the bus through the engine's choke points.
#include "replay/session.h"

#include <poll.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <random>

#include <fmt/format.h>

#include "kvm/pmu.h"
#include "logging/trace_format.h"
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
    if (tap_) tap_(bytes);
  }
  uint64_t bytes() const { return bytes_; }
  std::function<void(std::span<const uint8_t>)> tap_;

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
  if (auto built = build_machine(config, serial_out); !built) return built;
  return load_image(image, image_name, load, modules, initrd);
}

Result<> Session::build_machine(const MachineConfig& config, const std::string& serial_out) {
  auto sink = FileSink::open(serial_out);
  if (!sink) return std::unexpected(sink.error());
  out_ = std::move(*sink);
  tee_ = std::make_unique<TeeSink>(*out_, engine_);
  auto machine = Machine::create(config, engine_, *tee_, &engine_, &engine_);
  if (!machine) return std::unexpected(machine.error());
  machine_ = std::move(*machine);
  cpu_has_nx_ = config.cpu_model->has(feature("NX"));
  vcpus_.clear();
  for (size_t i = 0; i < machine_->vcpu_count(); ++i) vcpus_.push_back(Vcpu{.cpu = &machine_->backend(i)});
  current_ = 0;
  // Application processors wait for STARTUP (docs/smp.md) in the state INIT leaves.
  for (size_t i = 1; i < vcpus_.size(); ++i) {
    if (auto s = vcpus_[i].cpu->set_state(cpu_state_after_init(cpu_signature())); !s) return std::unexpected(s.error());
  }
  engine_.set_position_source([this] { return position(); });
  has_budget_ = machine_->backend().set_instruction_budget(0).has_value();
  return {};
}

Result<> Session::load_image(std::span<const uint8_t> image, const std::string& image_name, const LoadOptions& load,
                             std::span<const std::vector<uint8_t>> modules, std::span<const uint8_t> initrd) {
  LoadOptions options = load;
  options.cpu_has_nx = cpu_has_nx_;
  auto loaded = load_guest_image_bytes(machine_->memory(), image, image_name, options, modules, initrd);
  if (!loaded) return std::unexpected(loaded.error());
  image_format_ = loaded->format;
  return machine_->backend().set_state(loaded->initial_state);
}

std::string Session::counter_description() {
  ProgressCounter* c = machine_->backend().progress_counter();
  return c ? c->describe() : std::string();
}

uint64_t Session::serial_bytes() const { return tee_ ? tee_->bytes() : 0; }

void Session::set_fault_plan(const FaultPlan& plan) {
  engine_.set_fault_plan(plan);
  const auto& disks = machine_->disks();
  for (unsigned i = 0; i < disks.size(); ++i) disks[i]->set_faults(plan.any() ? &engine_ : nullptr, i);
}

void Session::set_serial_tap(std::function<void(std::span<const uint8_t>)> tap) {
  DEJA_ASSERT(tee_ != nullptr, "set_serial_tap() after build()");
  tee_->tap_ = std::move(tap);
}

bool Session::guest_caused(ExitKind kind) const {
  switch (kind) {
    case ExitKind::kIoIn:
    case ExitKind::kIoOut:
    case ExitKind::kMmioRead:
    case ExitKind::kMmioWrite:
    case ExitKind::kHlt:
    case ExitKind::kMsrRead:
    case ExitKind::kMsrWrite:
    case ExitKind::kPause:  // (only with several vCPUs whose schedule stops at PAUSE)
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
  const uint64_t seed =
      choice.emulated_skid ? (choice.emulated_seed ? *choice.emulated_seed : std::random_device{}()) : 0;
  for (size_t i = 0; i < vcpus_.size(); ++i) {
    Backend& cpu = *vcpus_[i].cpu;
    if (choice.emulated_skid) {
      // (each vCPU's counter draws its own lateness, from its own generator)
      if (auto r = cpu.emulate_pmu_skid(*choice.emulated_skid, seed + i); !r) {
        return fail(ErrorKind::kInvalidArgument,
                    "--progress emulated-pmu needs the software CPU (--backend interp): {}", r.error().message);
      }
    } else if (!cpu.progress_counter()) {
      if (vcpus_.size() > 1) {
        // (the vCPUs take turns on this thread, whose PMU counter would count every vCPU's branches)
        return fail(ErrorKind::kUnsupported,
                    "exact progress through the host PMU is not implemented for several vCPUs on KVM; record with "
                    "--progress exit-sync");
      }
      if (auto r = attach_pmu_counter(cpu); !r) return r;
    }
    if (engine_.mode() == Mode::kReplay) {
      vcpus_[i].seeker = std::make_unique<CoordinateSeeker>(cpu, *cpu.progress_counter());
    }
  }
  if (choice.emulated_skid) {
    say("note: emulating a PMU whose overflow lands up to {} branches late (repeat with --progress "
        "emulated-pmu:{}:{})",
        *choice.emulated_skid, *choice.emulated_skid, seed);
  }
  return {};
}

Result<> Session::derive_time(Engine::TimeRates rates) {
  Backend& cpu = machine_->backend();
  if (!cpu.instruction_count()) {
    return fail(ErrorKind::kUnsupported, "the {} backend does not count instructions, from which this time follows",
                cpu.name());
  }
  // One clock for every vCPU: it advances by all their instructions (docs/smp.md, "Time").
  engine_.derive_time(rates, [this]() -> std::optional<uint64_t> {
    uint64_t sum = 0;
    for (const Vcpu& v : vcpus_) sum += v.cpu->instruction_count().value_or(0);
    return sum;
  });
  derived_budget_ = has_budget_;
  answer_rdtsc_inline_where_possible();
  return {};
}

void Session::count_rdtsc_as_guest_exits(bool on) {
  rdtsc_exits_are_guest_exits_ = on;
  answer_rdtsc_inline_where_possible();
}

void Session::answer_rdtsc_inline_where_possible() {
  // An RDTSC exit that counts as a guest exit is a coordinate (every recording before the inline RDTSC): it
  // stays an exit. Otherwise, with derived time, the exit only asks the engine what tsc_now() says.
  const bool inline_tsc = engine_.derived_time_rates() && !rdtsc_exits_are_guest_exits_;
  for (const Vcpu& v : vcpus_) {
    v.cpu->answer_rdtsc_inline(inline_tsc ? std::function<uint64_t()>([this] { return engine_.tsc_now(); })
                                          : std::function<uint64_t()>());
  }
}

Result<CpuState> Session::comparable_state(uint32_t vcpu) {
  const Vcpu& v = vcpus_[vcpu];
  auto st = v.cpu->get_state();
  // KVM has finished an MMIO-writing instruction when it exits, the software CPU finishes it when it runs again.
  // For a plain store (what MMIO writes are) the RIP is all that differs: take the exit's, the next instruction.
  if (st && mmio_write_exits_complete_ && v.after_mmio_write) st->rip = v.last_exit_rip;
  return st;
}

std::vector<CpuState> Session::comparable_states() {
  std::vector<CpuState> states;
  for (uint32_t i = 0; i < vcpus_.size(); ++i) {
    auto st = comparable_state(i);
    states.push_back(st ? *st : CpuState{});
  }
  return states;
}

// The running vCPU's coordinate: its own counts and registers (docs/smp.md, "Coordinates and events").
Position Session::position() {
  Position p;
  p.at.vcpu = current_;
  p.guest_exits = now().guest_exits;
  p.instructions = cpu().instruction_count();
  if (engine_.progress() == ProgressMode::kExitSync) {
    // Exit-synchronous coordinates: the n-th guest-caused exit and the instruction that caused it.
    p.at.rip = now().last_exit_rip;
    return p;
  }
  auto st = comparable_state(current_);
  if (st) {
    p.at.rip = st->rip;
    p.at.rcx = st->gpr[kRcx];
    p.gpr_digest = gpr_digest(*st);
  }
  p.at.branches = cpu().branch_count().value_or(0);
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
// With a simulated host, the networks are run and their frames taken at derived time `now` instead (wires with
// seeded latency and faults between them and the NICs: Engine::exchange_network).
std::vector<NetFrameIn> Session::take_network_frames(uint64_t now) {
  std::vector<NetFrameIn> frames;
  auto& networks = engine_.networks();
  if (networks.empty()) return frames;
  const bool simulated = engine_.networks_simulated();
  if (simulated) {
    engine_.exchange_network(now);
  } else if (const uint64_t host_now = HostClock::monotonic_ns(); host_now >= next_net_poll_ns_) {
    for (auto& n : networks) n->poll_now();
    next_net_poll_ns_ = host_now + kNetPollNs;
  }
  const auto& nics = machine_->nics();
  for (size_t i = 0; i < networks.size() && i < nics.size(); ++i) {
    const size_t room = std::min<size_t>(kMaxFramesPerEvent, nics[i]->rx_capacity());
    for (auto& f : simulated ? engine_.network_frames_arrived(unsigned(i), now, room) : networks[i]->take(room)) {
      frames.push_back(NetFrameIn{unsigned(i), std::move(f)});
    }
  }
  return frames;
}

// Whether something outside the vCPU is due now (a device deadline, frames a NIC can take): recording in exact
// mode then stops the vCPU at the next instruction boundary to let it in, rather than at the next timer tick.
bool Session::async_work_due() {
  auto deadline = machine_->next_deadline_ns();
  const uint64_t now = engine_.running_now_ns();
  if (deadline && engine_.timer_due_ns(*deadline) <= now) return true;
  if (engine_.networks_simulated()) {
    auto next = next_network_ns();
    return next && *next <= now;
  }
  auto& networks = engine_.networks();
  const auto& nics = machine_->nics();
  for (size_t i = 0; i < networks.size() && i < nics.size(); ++i) {
    if (networks[i]->pending() > 0 && nics[i]->rx_capacity() > 0) return true;
  }
  return false;
}

std::optional<uint64_t> Session::next_network_ns() {
  if (!engine_.networks_simulated()) return std::nullopt;
  std::optional<uint64_t> next;
  const auto& nics = machine_->nics();
  for (size_t i = 0; i < nics.size(); ++i) {
    next = earliest(next, engine_.next_network_ns(unsigned(i), nics[i]->rx_capacity() > 0));
  }
  return next;
}

std::optional<uint64_t> Session::scripted_input_arrival() {
  if (!input_ || input_->at_end()) return std::nullopt;
  return input_->next_arrival_ns(engine_.running_now_ns());
}

// Run / record: let host time and host input into the machine, if anything is due.
void Session::poll_async(bool idle) {
  auto deadline = machine_->next_deadline_ns();
  const std::optional<uint64_t> network = next_network_ns();
  uint64_t now = idle ? engine_.idle_now_ns(earliest(deadline, scripted_input_arrival()), network)
                      : engine_.running_now_ns();
  bool due = deadline && engine_.timer_due_ns(*deadline) <= now;
  // A halted guest's wait that ends at a simulated network's own work (its timers) is an asynchronous event like a
  // device deadline, even with nothing for the guest: derived time moves on to it (and the idle limit counts it).
  if (idle && network && *network <= now) due = true;
  uint8_t buf[256];
  size_t n = 0;
  if (input_ && !input_->at_end()) {
    size_t space = std::min(machine_->uart().rx_space(), sizeof(buf));
    if (space > 0) n = input_->read_available(std::span(buf, space), now);
  }
  std::vector<NetFrameIn> frames = take_network_frames(now);
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
      if (at.vcpu() != current_) return;  // another vCPU's: the schedule gets there
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
  Backend& cpu = this->cpu();
  InterruptController& interrupts = machine_->interrupts(current_);
  Vcpu& v = now();
  if (!interrupts.interrupt_pending()) {
    cpu.request_interrupt_window(false);
    v.seeking_window = false;
    v.window_steps = 0;
    v.blocked_exits = 0;
    return {};
  }
  if (engine_.progress() == ProgressMode::kExitSync && engine_.mode() != Mode::kRun) {
    // Exit-synchronous: inject only at guest-caused exits (delivered right after the exiting
    // instruction), never through interrupt-window exits, whose timing an emulated CPU (nested KVM
    // under QEMU) does not reproduce exactly from run to run; or, where the vCPU cannot take it there, at the first
    // instruction boundary after it where it can, single-stepping to it (step_to_interrupt_windows).
    cpu.request_interrupt_window(false);
    const bool at_exit = guest_caused(v.last_exit_kind);
    // While seeking a window, also at the steps' own exits; never at a kick, which lands where host time says (a
    // replay has none there) and, on KVM, where the vCPU may be running unstepped (inside an exception handler).
    const bool at_step = v.seeking_window && v.last_exit_kind == ExitKind::kDebug;
    if (!at_exit && !at_step) return {};
    if (!cpu.can_inject_interrupt()) {
      // Stepping costs an exit an instruction: only for a vCPU that went kBlockedExitsBeforeSteps guest exits
      // without a chance to take it (usually the next exit after an interrupt handler's IRET has one).
      if (at_exit && v.blocked_exits < kBlockedExitsBeforeSteps) ++v.blocked_exits;
      v.seeking_window = !v.halted && v.blocked_exits >= kBlockedExitsBeforeSteps &&
                         v.window_steps < interrupt_window_steps_;
      return {};
    }
    v.seeking_window = false;
    v.window_steps = 0;
    v.blocked_exits = 0;
  } else if (!cpu.can_inject_interrupt()) {
    cpu.request_interrupt_window(true);
    return {};
  }
  uint8_t vector = interrupts.acknowledge();
  engine_.interrupt(vector, position());
  if (scheduler_) schedule_event(ScheduleEvent::kInterrupt, position().at.rip);
  cpu.request_interrupt_window(false);
  v.last_exit_kind = ExitKind::kKicked;  // one injection per exit
  v.halted = false;
  return cpu.inject_interrupt(vector);
}

void Session::maybe_digest() {
  if (engine_.mode() == Mode::kRun || engine_.events_processed() < next_digest_at_) return;
  next_digest_at_ = engine_.events_processed() + digest_interval_;
  DigestParts parts;
  Digest d = machine_digest(comparable_states(), machine_->memory(), machine_->device_states(), &parts);
  std::vector<std::string> names;
  for (const auto& part : machine_->stateful_parts()) names.push_back(part.name);
  engine_.record_digest(position(), d, cpu().instruction_count().value_or(0), parts, names);
}

Digest Session::final_cpu_ram_digest() {
  auto st = machine_->backend().get_state();
  return cpu_ram_digest(st ? *st : CpuState{}, machine_->memory());
}

Digest Session::final_machine_digest() {
  std::vector<CpuState> states;
  for (const Vcpu& v : vcpus_) {
    auto st = v.cpu->get_state();
    states.push_back(st ? *st : CpuState{});
  }
  auto devices = machine_->device_states();
  return machine_digest(states, machine_->memory(), devices);
}

Session::VcpuCounts Session::vcpu_counts(uint32_t vcpu) {
  const Vcpu& v = vcpus_.at(vcpu);
  return VcpuCounts{v.cpu->instruction_count().value_or(0), v.cpu->branch_count().value_or(0), v.guest_exits};
}

// HLT in run/record: sleep (in host time) until a device event, input or a network packet can wake the guest.
Result<std::optional<Outcome>> Session::wait_for_wake() {
  auto& networks = engine_.networks();
  const uint64_t idle_from = engine_.running_now_ns();
  for (;;) {
    if (vcpus_.size() == 1 ? machine_->interrupts().interrupt_pending() : any_runnable()) return std::nullopt;
    if (vcpus_.size() > 1) {
      if (auto stuck = machine_stuck()) return Outcome{exit_status::kGuestStopped, *stuck, false};
    }
    if (g_stop_requested.load()) return std::nullopt;
    if (!engine_.host_error().empty()) return std::nullopt;
    auto deadline = machine_->next_deadline_ns();
    bool input_open = input_ && !input_->at_end();
    if (!deadline && !input_open && networks.empty()) {
      return Outcome{exit_status::kGuestStopped, "the guest halted with no timer armed and no input attached", false};
    }
    if (engine_.host_simulated()) {
      // No host to wait for: the wait ends at the next deadline, scripted input or network work, at once
      // (Engine::idle_now_ns).
      const bool time_goes_on = deadline || scripted_input_arrival() || next_network_ns();
      if (limits_ && limits_->max_idle_ns && !scripted_input_arrival() &&
          engine_.running_now_ns() > idle_from + limits_->max_idle_ns) {
        return Outcome{exit_status::kGuestStopped,
                       fmt::format("{}every vCPU halted for {} ms of guest time with nothing to wake it",
                                   kHangReason, limits_->max_idle_ns / 1'000'000),
                       false};
      }
      poll_async(true);
      if (!time_goes_on && !(vcpus_.size() == 1 ? machine_->interrupts().interrupt_pending() : any_runnable())) {
        return Outcome{exit_status::kGuestStopped,
                       networks.empty() ? "the guest halted with no timer armed, and the serial input waits for a "
                                          "guest that does not read it"
                                        : "the guest halted with no timer armed, and its network has nothing to send",
                       false};
      }
      continue;
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

const trace::End* Session::positional_end() {
  const trace::Event* e = engine_.peek();
  // An End reached through the guest's own exit port write is matched there, not at a coordinate.
  if (!e || e->kind_case() != trace::Event::kEnd || e->end().reason() == "guest exit") return nullptr;
  return &e->end();
}

std::optional<Outcome> Session::replay_end_here() {
  const trace::End* end = positional_end();
  if (!end) return std::nullopt;
  // The whole coordinate, guest exits included; whether the guest really got there (instructions,
  // state, output) is check_replay_end()'s question.
  const Position here = position();
  if (!same_coordinate(end->at(), here, engine_.progress())) return std::nullopt;
  // An earlier visit of the End's coordinate: a loop that neither branches nor changes a register (`1: incq mem;
  // jmp 1b`), or in exit-sync mode any point between the same two guest exits. Where the backend counts
  // instructions only the recorded count is the End: the seeker (exact) or the instruction budget (exit-sync,
  // aim()) takes the replay there.
  const bool reachable = engine_.progress() == ProgressMode::kExact || has_budget_;
  if (reachable && end->instructions() != 0 && here.instructions && *here.instructions < end->instructions()) {
    return std::nullopt;
  }
  return Outcome{end->exit_status(), end->reason(), false, true};
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
  Vcpu& v = now();
  ++v.exit_counts[exit.kind];
  v.last_exit_kind = exit.kind;
  v.after_mmio_write = exit.kind == ExitKind::kMmioWrite;
  switch (exit.kind) {
    case ExitKind::kIoIn:
    case ExitKind::kIoOut:
    case ExitKind::kMmioRead:
    case ExitKind::kMmioWrite:
      schedule_event(ScheduleEvent::kDeviceAccess, exit.rip);
      break;
    case ExitKind::kPause:
      schedule_event(ScheduleEvent::kPause, exit.rip);
      break;
    case ExitKind::kLocked:
      schedule_event(ScheduleEvent::kLocked, exit.rip);
      break;
    default:
      break;
  }
  if (guest_caused(exit.kind)) {
    ++v.guest_exits;
    v.last_exit_rip = exit.rip;
    if (engine_.mode() == Mode::kRecord) last_guest_exit_host_ns_ = HostClock::monotonic_ns();
  }
  machine_->select_vcpu(current_);  // the local APIC the buses and the APIC MSRs answer with
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
      // Outside the vCPU deja emulates the TSC, the MSRs of the machine's devices (the local APIC's on
      // pc-apic) and the CPU model's own MSRs (a function of the model: not recorded); every other one is
      // #GP, as on a CPU that lacks it.
      if (const ModelMsr* model_msr = machine_->config().cpu_model->msr(exit.msr)) {
        exit.value = model_msr->value;
        exit.fault = false;
      } else if (exit.msr == msr::kTsc) {
        exit.value = engine_.msr_read(exit.msr, exit.rip, engine_.mode() == Mode::kReplay ? 0 : engine_.tsc_now());
        exit.fault = false;
      } else if (auto device = machine_->read_msr(exit.msr, current_)) {
        auto [value, fault] = engine_.device_msr_read(exit.msr, device->value, device->fault, exit.rip);
        exit.value = value;
        exit.fault = fault;
      } else {
        exit.fault = true;
      }
      break;
    case ExitKind::kMsrWrite:
      if (const ModelMsr* model_msr = machine_->config().cpu_model->msr(exit.msr)) {
        exit.fault = !model_msr->accepts(exit.value);
      } else {
        exit.fault = !machine_->write_msr(exit.msr, exit.value, current_).value_or(false);
      }
      break;
    case ExitKind::kHlt: {
      v.halted = true;
      // Several vCPUs: another may still wake this one (schedule() stops the machine when none can run).
      if (vcpus_.size() > 1) break;
      auto st = cpu().get_state();
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
    case ExitKind::kLocked:
      break;
    case ExitKind::kPause:
      if (pauses_left_ > 0) --pauses_left_;
      break;
    case ExitKind::kCoordinateMissed:
      if (engine_.mode() == Mode::kReplay && engine_.peek()) {
        engine_.report_divergence("the guest went past the point where the recording has its next event, "
                                  "without reaching it: " + exit.detail,
                                  describe_event(*engine_.peek()), "no stop at that coordinate");
      }
      break;
    case ExitKind::kKicked:
      kicked_ = true;
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
        // Several vCPUs: a vCPU spinning without guest exits keeps the others from running (they switch only at
        // guest exits), and what it waits for is usually theirs: stop as cleanly, timer or not. (Not while no other
        // vCPU could run: Linux's BSP boots for seconds without an exit in a nested guest, the APs still waiting for
        // their STARTUP.)
        bool other_runnable = false;
        for (uint32_t other = 0; quiet > kSpinStopNs && other < vcpus_.size(); ++other) {
          other_runnable |= other != current_ && runnable(other);
        }
        if (other_runnable) {
          return Outcome{exit_status::kGuestStopped,
                         fmt::format("stopped: vCPU {} spun for {} s without a guest exit, so the other vCPUs could "
                                     "not run (exit-synchronous recording switches vCPUs only at guest exits{}); "
                                     "record with --backend interp --progress exact",
                                     current_, kSpinStopNs / 1'000'000'000,
                                     scheduler_ && scheduler_->config().pause_limit == 0
                                         ? ", and this KVM does not stop at PAUSE"
                                         : ""),
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
  g_kick_target.store(&cpu());
  kicker_ = std::thread([this] {
    while (!kicker_stop_.load()) {
      uint64_t now = HostClock::monotonic_ns();
      uint64_t at = kick_at_.load();
      if (now >= at) {
        if (Backend* running = g_kick_target.load()) running->kick();  // (switch_to() moves it)
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

void request_stop() { on_stop_signal(0); }

std::string Session::host_failure() const {
  if (!engine_.host_error().empty()) return engine_.host_error();
  return out_ ? out_->error() : std::string();
}

Result<trace::Footer> Session::finish_recording(const Outcome& outcome) {
  Digest full = final_machine_digest();
  trace::End end;
  *end.mutable_at() = to_proto(position());
  end.set_exit_status(outcome.status);
  end.set_digest(full.bytes.data(), full.bytes.size());
  end.set_instructions(cpu().instruction_count().value_or(0));
  end.set_reason(outcome.reason);
  trace::Footer footer;
  footer.set_final_digest(full.bytes.data(), full.bytes.size());
  uint64_t instructions = 0, branches = 0;
  for (uint32_t i = 0; i < vcpus_.size(); ++i) {
    const VcpuCounts counts = vcpu_counts(i);
    instructions += counts.instructions;
    branches += counts.branches;
    if (vcpus_.size() > 1) {
      trace::VcpuSummary* summary = footer.add_vcpus();
      summary->set_instructions(counts.instructions);
      summary->set_branches(counts.branches);
      summary->set_guest_exits(counts.guest_exits);
    }
  }
  footer.set_instructions(instructions);
  footer.set_branches(branches);
  footer.set_wall_ns(engine_.host_simulated() ? 0 : wall_ns_);  // (a simulated run is the same on every host)
  footer.set_exit_status(outcome.status);
  const trace::Footer stated = footer;
  if (auto r = engine_.finish_record(std::move(end), std::move(footer)); !r) return std::unexpected(r.error());
  return stated;
}

// ---- several vCPUs (docs/smp.md) ----------------------------------------------------------------------

uint32_t Session::cpu_signature() const { return machine_->config().cpu_model->cpuid(1, 0).eax; }

Result<> Session::set_schedule(const ScheduleConfig& config) {
  if (vcpus_.size() < 2) return fail(ErrorKind::kInvalidArgument, "a schedule needs several vCPUs");
  if (config.unit == SliceUnit::kInstructions && !has_budget_) {
    return fail(ErrorKind::kUnsupported, "the schedule's slices are counted in retired instructions, where the {} "
                "backend cannot stop a vCPU (replay with --backend interp)", machine_->backend().name());
  }
  auto made = make_scheduler(config);
  if (!made) return std::unexpected(made.error());
  // A spin-wait yields to the other vCPUs: every PAUSE is an exit the schedule sees (pause_limit 0: none is).
  for (const Vcpu& v : vcpus_) {
    if (auto r = v.cpu->set_pause_exits(config.pause_limit > 0); !r) {
      return fail(ErrorKind::kUnsupported, "the schedule stops vCPUs at PAUSE: {}", r.error().message);
    }
    if (auto r = v.cpu->set_lock_exits(config.lock_events); !r) {
      return fail(ErrorKind::kUnsupported, "the schedule stops vCPUs at locked instructions: {}", r.error().message);
    }
  }
  scheduler_ = std::move(*made);
  switch_to(0);  // the bootstrap processor's first slice
  return {};
}

uint64_t Session::total_steps() {
  uint64_t sum = 0;
  for (const Vcpu& v : vcpus_) sum += v.cpu->step_count().value_or(0);
  return sum;
}

bool Session::runnable(uint32_t v) {
  if (machine_->apic_bus()->activity(v) != ApicFabric::Activity::kRunning) return false;
  if (!vcpus_[v].halted) return true;
  // Halted: an interrupt it can take wakes it (an NMI was made pending in its backend, which cleared `halted`).
  if (!machine_->interrupts(v).interrupt_pending()) return false;
  auto st = vcpus_[v].cpu->get_state();
  return st && (st->rflags & rflags::kIf);
}

bool Session::any_runnable() {
  for (uint32_t v = 0; v < vcpus_.size(); ++v) {
    if (runnable(v)) return true;
  }
  return false;
}

std::optional<std::string> Session::machine_stuck() {
  for (uint32_t v = 0; v < vcpus_.size(); ++v) {
    if (machine_->apic_bus()->activity(v) != ApicFabric::Activity::kRunning) continue;  // only an IPI starts it
    if (!vcpus_[v].halted) return std::nullopt;
    auto st = vcpus_[v].cpu->get_state();
    if (st && (st->rflags & rflags::kIf)) return std::nullopt;  // a device interrupt can wake it
  }
  return std::string("every vCPU halted with interrupts disabled or waits for a STARTUP message: nothing can wake the "
                     "machine");
}

void Session::switch_to(uint32_t v) {
  current_ = v;
  machine_->select_vcpu(v);
  engine_.set_vcpu(v);
  const Slice slice = scheduler_->slice(v);
  slice_end_ = (scheduler_->config().unit == SliceUnit::kInstructions ? cpu().step_count().value_or(0)
                                                                       : now().guest_exits) +
               slice.length;
  pauses_left_ = slice.pauses;
  if (g_kick_target.load()) g_kick_target.store(&cpu());
}

Result<std::optional<Outcome>> Session::schedule() {
  ApicFabric& bus = *machine_->apic_bus();
  // What the APIC bus signalled since the last look, in vCPU order.
  for (uint32_t v = 0; v < vcpus_.size(); ++v) {
    const ApicFabric::Pending pending = bus.take_pending(v);
    Backend& target = *vcpus_[v].cpu;
    if (pending.reset) {
      if (v == 0) {
        return Outcome{exit_status::kGuestStopped,
                       "INIT sent to the bootstrap processor (vCPU 0): it would restart the firmware at the reset "
                       "vector, which deja's machine does not have",
                       false};
      }
      if (auto r = target.set_state(cpu_state_after_init(cpu_signature())); !r) return std::unexpected(r.error());
      vcpus_[v].halted = false;
    }
    if (pending.start_vector) {
      if (auto r = target.set_state(cpu_state_at_startup(*pending.start_vector, cpu_signature())); !r) {
        return std::unexpected(r.error());
      }
      vcpus_[v].halted = false;
    }
    if (pending.nmi) {
      if (auto r = target.inject_nmi(); !r) return std::unexpected(r.error());
      vcpus_[v].halted = false;
    }
  }
  if (auto r = follow_company(); !r) return std::unexpected(r.error());
  const bool can_run = runnable(current_);
  const bool slice_over = scheduler_->config().unit == SliceUnit::kInstructions
                              ? cpu().step_count().value_or(0) >= slice_end_
                              : now().guest_exits >= slice_end_;
  // A plain run in slices of guest exits also switches where host time kicked the vCPU (aim()), so that a vCPU
  // spinning without exits (without PAUSE exits: stock KVM; or with no PAUSE at all, as Linux's delay calibration on
  // an AP waiting for jiffies) lets the others run; a recording cannot, as no coordinate places a kick.
  const bool preempted = std::exchange(kicked_, false) && engine_.mode() == Mode::kRun &&
                         scheduler_->config().unit == SliceUnit::kGuestExits;
  SwitchPoint why;
  if (!can_run) why = SwitchPoint::kIdle;
  else if (scheduler_->preempting()) why = SwitchPoint::kPreempt;
  else if (slice_over || preempted) why = SwitchPoint::kSliceEnd;
  else if (pauses_left_ == 0 && scheduler_->config().pause_limit > 0) why = SwitchPoint::kPause;
  else return std::nullopt;
  std::array<bool, kMaxVcpus> ready{};
  bool any = false;
  for (uint32_t v = 0; v < vcpus_.size(); ++v) any |= ready[v] = runnable(v);
  if (!any) {
    // Nothing can run: the machine waits for an interrupt (the run loop's HLT handling), unless nothing can come.
    if (auto stuck = machine_stuck()) return Outcome{exit_status::kGuestStopped, *stuck, false};
    return std::nullopt;
  }
  switch_to(scheduler_->next(current_, why, std::span<const bool>(ready.data(), vcpus_.size())));
  if (auto r = follow_company(); !r) return std::unexpected(r.error());
  return std::nullopt;
}

Result<> Session::follow_company() {
  const ScheduleConfig& c = scheduler_->config();
  if (c.version < kScheduleVersionPauseWithCompany || c.pause_limit == 0) return {};
  // Evaluated at every turn, from the vCPUs' states alone: another vCPU becomes runnable only at a turn a recording
  // and its replay both make (the running vCPU's IPI is an exit, a device interrupt an event), so both see the change
  // at the same instruction. Nothing to keep in a checkpoint: the next turn computes the same. (The slice's PAUSE count
  // is untouched while they do not exit.)
  bool company = false;
  for (uint32_t other = 0; other < vcpus_.size() && !company; ++other) company = other != current_ && runnable(other);
  return cpu().set_pause_exits(company);
}

void Session::schedule_event(ScheduleEvent event, uint64_t rip) {
  ++schedule_events_;
  if (!scheduler_) return;
  const std::optional<uint32_t> change_point = scheduler_->event(current_, event);
  if (change_point && preemptions_.size() < 4096) {
    preemptions_.push_back(Preemption{current_, rip, schedule_events_, *change_point});
  }
}

std::optional<Outcome> Session::limit_reached() {
  const RunLimits& l = *limits_;
  const uint64_t steps = total_steps();
  if (const uint64_t out = serial_bytes(); out != limit_serial_seen_) {
    limit_serial_seen_ = out;
    limit_progress_step_ = steps;
  }
  if (l.stop) {
    if (auto why = l.stop()) return Outcome{exit_status::kInterrupted, fmt::format("{}{}", kLimitReason, *why), false};
  }
  if (l.max_steps && steps >= l.max_steps) {
    return Outcome{exit_status::kInterrupted, fmt::format("{}{} instructions", kLimitReason, l.max_steps), false};
  }
  if (l.hang_steps && steps - limit_progress_step_ >= l.hang_steps) {
    return Outcome{exit_status::kGuestStopped, fmt::format("{}no serial output in {} instructions", kHangReason,
                                                           l.hang_steps),
                   false};
  }
  return std::nullopt;
}

// ---- the run loop ----------------------------------------------------------------------------------
// One loop for run, record and replay, plain or steppable (rr's replay loop over replay_step): run() is
// run_until() with nothing to stop at, and each turn of the loop is step().

Result<Outcome> Session::run() {
  const uint64_t started = HostClock::monotonic_ns();
  // A spin is measured from the first run on: building the machine and writing the trace's header take host time too
  // (seconds, in a nested guest), in which no vCPU ran.
  last_guest_exit_host_ns_ = started;
  next_digest_at_ = digest_interval_;
  next_heartbeat_ = started + kHeartbeatNs;
  if (engine_.mode() != Mode::kReplay) start_kicker();
  else g_kick_target.store(&cpu());  // SIGINT/SIGTERM stop a replay too, even one the seeker is stepping
  struct KickerGuard {
    Session* s;
    ~KickerGuard() { s->stop_kicker(); }
  } guard{this};
  auto stopped = run_until(StopRequest{});
  // Every way out keeps the wall time: an interrupted recording's footer has it too.
  wall_ns_ = HostClock::monotonic_ns() - started;
  if (!stopped) return std::unexpected(stopped.error());
  if (stopped->kind == StopReason::Kind::kInterrupted) return Outcome{exit_status::kInterrupted, "interrupted", false};
  DEJA_ASSERT(stopped->kind == StopReason::Kind::kEnd, "run() asks for no stop but the end");
  return stopped->outcome;
}

Result<StopReason> Session::run_until(const StopRequest& stop) {
  if (ended_) return StopReason{StopReason::Kind::kEnd, 0, WatchKind::kWrite, 0, *ended_};
  Turn turn;
  turn.start_step = total_steps();
  for (;;) {
    tick_progress();
    auto stopped = step(stop, turn);
    if (!stopped) return std::unexpected(stopped.error());
    if (*stopped) return **stopped;
  }
}

std::optional<StopReason> Session::due_stop(const StopRequest& stop, Turn& turn) {
  Backend& cpu = this->cpu();
  const uint64_t step = total_steps();
  turn.step_over = false;
  if (turn.watch_stop) return turn.watch_stop;
  if (stop.at_step && step >= *stop.at_step) return StopReason{StopReason::Kind::kStep};
  if (stop.at_event && engine_.events_processed() >= *stop.at_event) return StopReason{StopReason::Kind::kEvent};
  if (!stop.breakpoints.empty() && !completes_on_next_run(now().last_exit_kind)) {
    auto st = cpu.get_state();
    if (st) {
      const bool code64 = (st->efer & efer::kLma) && st->cs.l;
      const uint64_t rip = code64 ? st->rip : (st->cs.base + st->rip) & 0xffffffffu;
      if (std::find(stop.breakpoints.begin(), stop.breakpoints.end(), rip) != stop.breakpoints.end()) {
        if (step != turn.start_step || !cpu.step_count() || stop.stop_at_start_breakpoint) {
          return StopReason{StopReason::Kind::kBreakpoint};
        }
        turn.step_over = true;  // started on a breakpoint: leave it with one step
      }
    }
  }
  if ((stop.interrupted && stop.interrupted()) || g_stop_requested.load()) return StopReason{StopReason::Kind::kInterrupted};
  return std::nullopt;
}

std::optional<SeekTarget> Session::seek_target() {
  const trace::Event* next = engine_.peek();
  if (!next) return std::nullopt;
  const trace::Coordinate* at = nullptr;
  uint64_t instructions = 0;  // recorded with heartbeats, the End and derived-time async events (0: not counted)
  if (engine_.next_positional()) {
    at = &engine_.positional_at(*next);
    instructions = Engine::positional_instructions(*next);
  }
  if (const trace::End* end = positional_end()) {
    at = &end->at();
    instructions = end->instructions();
  }
  // Another vCPU's event: this one runs its slice (the schedule is the recording's).
  if (!at || at->vcpu() != current_) return std::nullopt;
  // The guest-exit and instruction counts tell apart the visits of a point that a loop without a conditional
  // branch, or an idle `sti; hlt`, makes at the same registers.
  return SeekTarget{Coordinate{at->vcpu(), at->branches(), at->rip(), at->rcx()}, at->gpr_digest(),
                    [this, exits = at->guest_exits(), instructions] {
                      auto n = cpu().instruction_count();
                      const bool counted = instructions != 0 && n;
                      const uint64_t guest_exits = now().guest_exits;
                      if (guest_exits > exits || (counted && *n > instructions)) return Visit::kLater;
                      if (guest_exits < exits || (counted && *n < instructions)) return Visit::kEarlier;
                      return Visit::kTarget;
                    },
                    instructions};
}

Result<> Session::aim(const StopRequest& stop, const Turn& turn) {
  Backend& cpu = this->cpu();
  const Mode mode = engine_.mode();
  uint64_t budget = 0;  // instructions until the vCPU stops by itself; 0: no budget
  auto limit = [&budget](uint64_t n) { budget = budget == 0 ? n : std::min(budget, n); };
  if (mode == Mode::kReplay) {
    DebugControl user;
    user.watchpoints = stop.watchpoints;
    user.breakpoints = turn.step_over || turn.finish_instruction ? std::vector<uint64_t>{} : stop.breakpoints;
    // The session's steps are every vCPU's (total_steps()); the backend counts its own.
    const uint64_t own = cpu.step_count().value_or(0), others = total_steps() - own;
    if (stop.at_step) user.stop_at_step = *stop.at_step > others ? *stop.at_step - others : 0;
    if (turn.step_over) user.stop_at_step = std::min(user.stop_at_step.value_or(UINT64_MAX), own + 1);
    user.single_step = turn.finish_instruction || now().seeking_window;
    // (a debugger's step that finishes an instruction is one step, whatever clears TF)
    user.step_as_trap_flag = window_steps_trap_flag_ && !turn.finish_instruction;
    if (auto r = apply_debug(user); !r) return r;
    if (now().seeker) {
      now().seeker->set_target(seek_target());
    } else if (const trace::End* end = positional_end()) {
      // Exit-synchronous: the End lies between guest exits, where no coordinate but the instruction count places it.
      const Position here = position();
      if (same_coordinate(end->at(), here, engine_.progress())) {
        if (end->instructions() != 0 && here.instructions && *here.instructions < end->instructions()) {
          limit(end->instructions() - *here.instructions);
        } else if (!instructions_differ(end->instructions(), here)) {
          // The recording ended right after an interrupt was injected, before the handler's first instruction
          // (the stop kicked the vCPU as it entered): the backend delivers what was injected and returns, as it
          // did when recording.
          cpu.kick();
        }
      }
    }
    // A slice of about a million instructions, so that an interrupt request is seen in a long run.
    if (stop.interrupted) limit(1u << 20);
  } else {
    auto deadline = machine_->next_deadline_ns();
    uint64_t kick = deadline ? engine_.host_origin_ns() + *deadline : UINT64_MAX;
    if (derived_budget_) {
      // Derived time: the device is due where virtual time reaches its deadline, an instruction count away.
      if (deadline) limit(engine_.instructions_until(engine_.timer_due_ns(*deadline)));
      kick = UINT64_MAX;
    }
    if (auto arrival = scripted_input_arrival(); arrival && derived_budget_) {
      // Input scripted in guest time arrives where derived time reaches it, an instruction count away.
      limit(engine_.instructions_until(engine_.timer_due_ns(*arrival)));
    } else if (input_ && !input_->at_end() && !engine_.host_simulated()) {
      kick = std::min(kick, HostClock::monotonic_ns() + 10'000'000);
    }
    if (engine_.networks_simulated()) {
      // A simulated network's frames and timers are due where derived time reaches them (and never by host time:
      // a poll at a host-timed point would move its timers).
      if (auto next = next_network_ns(); next && derived_budget_) limit(engine_.instructions_until(*next));
    } else if (!engine_.networks().empty()) {
      // The NICs' host sockets are polled from the vCPU thread: at least every millisecond.
      kick = std::min(kick, HostClock::monotonic_ns() + kNetPollNs);
    }
    if (mode == Mode::kRecord && !engine_.host_simulated()) kick = std::min(kick, next_heartbeat_);
    if (interrupt_window_steps_ > 0) {
      const DebugControl steps{.single_step = now().seeking_window, .step_as_trap_flag = window_steps_trap_flag_};
      if (auto r = apply_debug(steps); !r) return r;
    }
    // A plain run in slices of guest exits switches at kicks too (schedule()): one every slice of host time.
    if (mode == Mode::kRun && scheduler_ && scheduler_->config().unit == SliceUnit::kGuestExits) {
      kick = std::min(kick, HostClock::monotonic_ns() + kRunSliceNs);
    }
    kick_at_.store(kick);
    if (limits_) {
      // Stop where a limit is reached (the top of the next turn checks it).
      const uint64_t steps = total_steps();
      if (limits_->max_steps) limit(limits_->max_steps > steps ? limits_->max_steps - steps : 1);
      if (limits_->hang_steps) {
        const uint64_t at = limit_progress_step_ + limits_->hang_steps;
        limit(at > steps ? at - steps : 1);
      }
    }
  }
  // Several vCPUs: the slice ends at an instruction count.
  if (scheduler_ && scheduler_->config().unit == SliceUnit::kInstructions) {
    const uint64_t at = cpu.step_count().value_or(0);
    limit(slice_end_ > at ? slice_end_ - at : 1);
  }
  if (has_budget_) {
    if (auto r = cpu.set_instruction_budget(budget); !r) return r;
  }
  return {};
}

Result<std::optional<StopReason>> Session::step(const StopRequest& stop, Turn& turn) {
  const Mode mode = engine_.mode();
  const bool exact = engine_.progress() == ProgressMode::kExact;
  auto end = [this](Outcome o) -> std::optional<StopReason> {
    ended_ = o;
    return StopReason{StopReason::Kind::kEnd, 0, WatchKind::kWrite, 0, std::move(o)};
  };

  turn.finish_instruction = false;
  if (mode == Mode::kReplay) {
    // Every stop is decided here, at the same point of every turn (so that stepping, seeking and a checkpoint
    // restore reach the same state), and only between instructions: right after an I/O, MMIO, MSR, RDTSC or
    // RDRAND exit the instruction is still to be completed by the next run(), so a stop due then takes one more
    // step first.
    if (auto due = due_stop(stop, turn)) {
      if (!completes_on_next_run(now().last_exit_kind)) return due;
      turn.finish_instruction = true;
    }
    replay_async();
    if (auto o = replay_end_here()) return end(*o);
    // Recording takes a due digest right after the asynchronous event that made it due, before the interrupt that
    // event may raise is delivered; replay consumes that event only here, so check here too.
    maybe_digest();
    if (engine_.divergence()) return end(Outcome{exit_status::kDivergence, "divergence", false});
    if (engine_.replay_exhausted() && !engine_.peek()) return end(Outcome{exit_status::kTraceEnded, "end of trace", false});
  } else {
    if (g_stop_requested.load() || (stop.interrupted && stop.interrupted())) {
      return StopReason{StopReason::Kind::kInterrupted};
    }
    if (record_turn_hook_ && mode == Mode::kRecord && !completes_on_next_run(now().last_exit_kind)) {
      const uint64_t before = HostClock::monotonic_ns();
      if (auto r = record_turn_hook_(); !r) return std::unexpected(r.error());
      // A hook that took a checkpoint may have outlasted the heartbeat's deadline: the kick would then stop the vCPU
      // before its first instruction and the heartbeat land at the checkpoint's own coordinate, after it, where a
      // replay that reaches that coordinate consumes it before it can stop (the segment would end one event late).
      if (const uint64_t after = HostClock::monotonic_ns(); after - before > kHookSlowNs) {
        next_heartbeat_ = std::max(next_heartbeat_, after + kHeartbeatNs);
      }
    }
    // A trace that cannot be written stops the run at once (its prefix is what is left); a failed disk overlay or
    // serial output stops it too, rather than letting the guest run on with its writes or its output lost, and
    // the recording ends there, saying so.
    if (!engine_.write_error().empty()) return fail(ErrorKind::kHost, "{}", engine_.write_error());
    if (std::string host = host_failure(); !host.empty()) {
      return end(Outcome{exit_status::kInterrupted, fmt::format("{}: {}", kHostFailureReason, host), false, false, true});
    }
    // (Anywhere an interruption may stop a recording: its End is found again the same way.)
    if (limits_) {
      if (auto o = limit_reached()) return end(*o);
    }
  }
  // Several vCPUs: the one to run now. (Not while an exit's instruction waits to be finished: a stop due there.)
  if (scheduler_ && !turn.finish_instruction) {
    auto stopped = schedule();
    if (!stopped) return std::unexpected(stopped.error());
    if (*stopped) return end(**stopped);
    if (mode == Mode::kReplay) {
      // What the recording let in where the new vCPU stands (its slice may start where it halted).
      replay_async();
      if (auto o = replay_end_here()) return end(*o);
    }
  }
  Backend& cpu = this->cpu();
  if (auto r = deliver_interrupts(); !r) return std::unexpected(r.error());
  // A digest an interrupt event made due is taken here, before the vCPU runs: where the run after an injection
  // stops (a kick in recording, the next exit in replay) differs between the two.
  maybe_digest();
  if (engine_.divergence()) return std::nullopt;  // the next turn ends the replay

  if (auto r = aim(stop, turn); !r) return std::unexpected(r.error());
  // A step to an interrupt window is the VMM's own work, and costs an exit per instruction (hundreds of microseconds
  // under nested KVM): the guest's time stands still through it. Were it to run on, a timer interrupt handler that
  // catches up tick by tick (Linux's tick_handle_periodic) fell further behind at each step and never returned.
  const bool stepping_to_window = mode != Mode::kReplay && now().seeking_window;
  const uint64_t run_started = stepping_to_window ? HostClock::monotonic_ns() : 0;
  auto exit = now().seeker ? now().seeker->run() : cpu.run();
  if (stepping_to_window) engine_.skip_host_time(HostClock::monotonic_ns() - run_started);
  if (!exit) return std::unexpected(exit.error());
  if (now().seeking_window && (*exit)->kind == ExitKind::kDebug) ++now().window_steps;
  auto done = handle_exit(**exit);
  if (!done) return std::unexpected(done.error());
  if (*done) return end(**done);
  if ((*exit)->kind == ExitKind::kDebug && (*exit)->watch_hit) {
    turn.watch_stop = StopReason{StopReason::Kind::kWatchpoint, (*exit)->address, WatchKind((*exit)->watch_kind),
                                 (*exit)->rip};
  }
  if (engine_.divergence()) return std::nullopt;

  if (mode == Mode::kReplay) {
    // The events recorded right after this exit are applied here, before the digest check below, as recording
    // let them in (not at the top of the next turn, after the next exit).
    replay_async();
    if ((*exit)->kind == ExitKind::kHlt) {
      if (auto o = replay_end_here()) return end(*o);
      const bool woken = vcpus_.size() == 1 ? machine_->interrupts().interrupt_pending() : any_runnable();
      if (!woken && !engine_.divergence() && engine_.peek()) {
        engine_.report_divergence("the guest halted, but the recording has no event to wake it here",
                                  describe_event(*engine_.peek()), "HLT");
      }
    }
  } else {
    // Where asynchronous events may land: anywhere in a plain run; at instruction boundaries the backend can find
    // again (exact) or right after guest-caused exits (exit-sync) when recording.
    const ExitKind kind = (*exit)->kind;
    const bool boundary_or_exit =
        mode == Mode::kRun ? true
        : exact ? (kind == ExitKind::kKicked || kind == ExitKind::kHlt || kind == ExitKind::kInterruptWindow)
                : guest_caused(kind);
    if (boundary_or_exit) {
      poll_async();
      if (mode == Mode::kRecord && !engine_.host_simulated() && HostClock::monotonic_ns() >= next_heartbeat_) {
        next_heartbeat_ = HostClock::monotonic_ns() + kHeartbeatNs;
        engine_.record_heartbeat(position(), cpu.instruction_count().value_or(0));
      }
    }
    // With several vCPUs the machine waits only when none can run.
    if (kind == ExitKind::kHlt && (vcpus_.size() == 1 || !any_runnable())) {
      auto woke = wait_for_wake();
      if (!woke) return std::unexpected(woke.error());
      if (*woke) return end(**woke);
    }
  }
  // What the recording let in after this exit (async events, heartbeats) precedes the digest it took at the end of
  // this turn. The check at the top covers an async event that made the digest due; this one an exit's own events
  // that did (exit-sync: a port read, then the async polled after it, then the digest), where checking before the
  // async would find it first.
  if (mode == Mode::kReplay) replay_async();
  maybe_digest();
  // A device that became due during this exit (a virtio notification) or frames a NIC can now take: stop at the
  // next instruction boundary to let them in.
  if (mode == Mode::kRecord && exact && async_work_due()) cpu.kick();
  return std::nullopt;
}

void Session::print_stats() {
  say("backend {} with CPU model {}", machine_->backend().name(), machine_->config().cpu_model->name());
  if (scheduler_) {
    const ScheduleConfig& c = scheduler_->config();
    say("{} vCPUs, schedule {} seed {} quantum {} {} PAUSEs up to {}", vcpus_.size(), c.policy, c.seed, c.quantum,
        slice_unit_name(c.unit), c.pause_limit);
  }
  for (uint32_t i = 0; i < vcpus_.size(); ++i) {
    const Vcpu& v = vcpus_[i];
    if (vcpus_.size() > 1) {
      const auto& counts = machine_->apic_bus()->counts(i);
      say("vCPU {}: {} guest exits; INIT {}, STARTUP {}, NMI {} received", i, v.guest_exits, counts.inits,
          counts.startups, counts.nmis);
    }
    say("exits by kind:");
    for (const auto& [kind, count] : v.exit_counts) say("  {:<20} {}", exit_kind_name(kind), count);
    if (auto n = v.cpu->instruction_count()) say("instructions retired: {}", *n);
    if (auto n = v.cpu->branch_count()) say("conditional branches retired: {}", *n);
    if (v.seeker) {
      const auto& st = v.seeker->stats();
      say("coordinate seeking ({}, skid {}): {} reached, {} counter overflows, {} breakpoint hits, {} single steps, "
          "{} runs to an instruction count",
          counter_description(), v.cpu->progress_counter()->skid(), st.reached, st.overflows, st.breakpoint_hits,
          st.single_steps, st.skips);
    }
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
  for (uint32_t i = 0; i < vcpus_.size(); ++i) {
    if (vcpus_.size() > 1) say("vCPU {}:", i);
    for (const std::string& line : vcpus_[i].cpu->statistics()) say("{}", line);
  }
}

// ---- the steppable replay ------------------------------------------------------------------------

Result<> Session::apply_debug(const DebugControl& control) {
  Vcpu& v = now();
  if (v.seeker) {
    v.seeker->set_user_debug(control);
    return {};
  }
  if (v.applied_debug && *v.applied_debug == control) return {};
  if (auto r = v.cpu->set_debug(control); !r) return r;
  v.applied_debug = control;
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

// With several vCPUs the counts are every vCPU's together (each vCPU's own are in the loop state).
CheckpointPosition Session::checkpoint_position() {
  CheckpointPosition at;
  at.steps = total_steps();
  at.events = engine_.events_processed();
  for (uint32_t i = 0; i < vcpus_.size(); ++i) {
    const VcpuCounts counts = vcpu_counts(i);
    at.branches += counts.branches;
    at.guest_exits += counts.guest_exits;
    at.instructions += counts.instructions;
  }
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

// The run loop's own state and the engine's trace cursor ("SESS" section of a checkpoint). Version 4 holds each
// vCPU's loop state and the schedule's, version 5 also each vCPU's search for an interrupt window; versions 3 (one
// vCPU, before several) and 4 are still read.
Result<std::vector<uint8_t>> Session::encode_loop_state() {
  auto cursor = engine_.save_cursor();
  if (!cursor) return std::unexpected(cursor.error());
  const Engine::Cursor& c = *cursor;
  StateWriter w("SESS", 5);
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
  w.u32(uint32_t(vcpus_.size()));
  for (const Vcpu& v : vcpus_) {
    w.u64(v.guest_exits);
    w.u8(uint8_t(v.last_exit_kind));
    w.u64(v.last_exit_rip);
    w.boolean(v.after_mmio_write);
    w.boolean(v.halted);
    w.u64(v.cpu->branch_count().value_or(0));
  }
  w.u32(current_);
  w.u64(slice_end_);
  w.u32(pauses_left_);
  const std::vector<uint8_t> schedule = scheduler_ ? scheduler_->save() : std::vector<uint8_t>{};
  w.u32(uint32_t(schedule.size()));
  w.bytes(schedule);
  for (const Vcpu& v : vcpus_) {
    w.boolean(v.seeking_window);
    w.u32(v.window_steps);
    w.u32(v.blocked_exits);
  }
  return w.take();
}

Result<> Session::decode_loop_state(std::span<const uint8_t> blob) {
  const uint8_t version = blob.size() > 4 && (blob[4] == 3 || blob[4] == 4) ? blob[4] : 5;
  StateReader r(blob, "SESS", version);
  struct Saved {
    uint64_t guest_exits = 0, last_rip = 0, branches = 0;
    uint8_t kind = 0;
    bool after_mmio_write = false, halted = false, seeking_window = false;
    uint32_t window_steps = 0, blocked_exits = 0;
  };
  auto read_vcpu = [&r](Saved& v, bool full) {
    v.guest_exits = r.u64();
    v.kind = r.u8();
    v.last_rip = r.u64();
    v.after_mmio_write = r.boolean();
    if (!full) return;
    v.halted = r.boolean();
    v.branches = r.u64();
    if (v.kind > uint8_t(ExitKind::kLocked)) r.invalid("exit kind out of range");
  };
  std::vector<Saved> saved(1);
  if (version == 3) read_vcpu(saved[0], false);
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
  uint32_t current = 0;
  uint64_t slice_end = 0;
  uint32_t pauses_left = 0;
  std::vector<uint8_t> schedule;
  if (version == 3) {
    saved[0].branches = vcpus_[0].cpu->branch_count().value_or(0);  // (restored with the backend's own state)
    if (saved[0].kind > uint8_t(ExitKind::kLocked)) r.invalid("exit kind out of range");
  } else {
    const uint32_t n = r.u32();
    if (r.ok() && n != vcpus_.size()) r.invalid(fmt::format("{} vCPUs saved, this machine has {}", n, vcpus_.size()));
    saved.assign(vcpus_.size(), Saved{});
    for (Saved& v : saved) {
      if (r.ok()) read_vcpu(v, true);
    }
    current = r.u32();
    slice_end = r.u64();
    pauses_left = r.u32();
    const uint32_t size = r.u32();
    if (size > 4096) r.invalid("schedule state too large");
    if (r.ok()) schedule.resize(size);
    r.bytes(schedule);
    if (current >= vcpus_.size()) r.invalid(fmt::format("running vCPU {} out of range", current));
    for (Saved& v : saved) {
      if (version < 5 || !r.ok()) break;
      v.seeking_window = r.boolean();
      v.window_steps = r.u32();
      v.blocked_exits = r.u32();
    }
  }
  if (auto done = r.finish(); !done) return done;
  if (scheduler_ && !schedule.empty()) {
    if (auto restored = scheduler_->restore(schedule); !restored) return restored;
  } else if (scheduler_ || !schedule.empty()) {
    return fail(ErrorKind::kInvalidArgument, "the checkpoint's schedule does not fit this session's");
  }
  if (auto moved = engine_.restore_cursor(c); !moved) return moved;
  for (size_t i = 0; i < vcpus_.size(); ++i) {
    Vcpu& v = vcpus_[i];
    v.guest_exits = saved[i].guest_exits;
    v.last_exit_kind = ExitKind(saved[i].kind);
    v.last_exit_rip = saved[i].last_rip;
    v.after_mmio_write = saved[i].after_mmio_write;
    v.halted = saved[i].halted;
    v.seeking_window = saved[i].seeking_window;
    v.window_steps = saved[i].window_steps;
    v.blocked_exits = saved[i].blocked_exits;
  }
  current_ = current;
  slice_end_ = slice_end;
  pauses_left_ = pauses_left;
  machine_->select_vcpu(current_);
  engine_.set_vcpu(current_);
  next_digest_at_ = next_digest;
  saved_branches_.clear();
  for (const Saved& v : saved) saved_branches_.push_back(v.branches);
  return {};
}

Result<MachineCheckpoint> Session::capture_checkpoint(CheckpointMemory& memory) {
  auto cp = capture_state();
  if (!cp) return cp;
  auto image = memory.capture();
  if (!image) return std::unexpected(image.error());
  cp->memory = *image;
  return cp;
}

std::vector<uint8_t> Session::shared_loop_state() const {
  StateWriter w("LOOP", 1);
  for (const Vcpu& v : vcpus_) w.u64(v.guest_exits);
  if (vcpus_.size() > 1) w.u32(current_);
  w.u64(next_digest_at_);
  w.u64(engine_.events_processed());
  for (uint64_t v : engine_.derived_time_state()) w.u64(v);
  return w.take();
}

Result<MachineCheckpoint> Session::capture_state() {
  if (engine_.divergence()) return fail(ErrorKind::kDivergence, "no checkpoint of a replay that diverged");
  if (ended_) return fail(ErrorKind::kInvalidArgument, "no checkpoint at the end of the replay ({})", ended_->reason);
  MachineCheckpoint cp;
  cp.at = checkpoint_position();
  for (size_t i = 0; i < vcpus_.size(); ++i) {
    auto st = vcpus_[i].cpu->get_state();
    if (!st) return std::unexpected(st.error());
    MachineCheckpoint::Vcpu v{encode_cpu_state(*st), vcpus_[i].cpu->save_internal()};
    if (i == 0) {
      cp.cpu = std::move(v.cpu);
      cp.backend = std::move(v.backend);
    } else {
      cp.more_vcpus.push_back(std::move(v));
    }
  }
  for (const auto& part : machine_->stateful_parts()) cp.devices.emplace_back(part.name, part.save());
  auto loop = encode_loop_state();
  if (!loop) return std::unexpected(loop.error());
  cp.session = std::move(*loop);
  return cp;
}

Result<> Session::restore_checkpoint(const MachineCheckpoint& cp, CheckpointMemory& memory) {
  if (auto r = memory.restore(cp.memory); !r) return std::unexpected(r.error());
  return restore_state(cp);
}

Result<> Session::restore_state(const MachineCheckpoint& cp) {
  if (cp.more_vcpus.size() + 1 != vcpus_.size()) {
    return fail(ErrorKind::kInvalidArgument, "the checkpoint holds {} vCPUs, this machine has {}",
                cp.more_vcpus.size() + 1, vcpus_.size());
  }
  std::vector<CpuState> cpu_states;
  for (size_t i = 0; i < vcpus_.size(); ++i) {
    auto st = decode_cpu_state(i == 0 ? cp.cpu : cp.more_vcpus[i - 1].cpu);
    if (!st) return std::unexpected(st.error());
    cpu_states.push_back(*st);
  }
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
  for (size_t i = 0; i < vcpus_.size(); ++i) {
    Vcpu& v = vcpus_[i];
    if (auto r = v.cpu->set_state(cpu_states[i]); !r) return r;
    if (auto r = v.cpu->restore_internal(i == 0 ? cp.backend : cp.more_vcpus[i - 1].backend); !r) return r;
    if (ProgressCounter* counter = v.cpu->progress_counter()) {
      if (auto r = counter->rebase(vcpus_.size() == 1 ? cp.at.branches : saved_branches_[i]); !r) return r;
    }
    if (v.seeker) {
      if (auto r = v.seeker->reset(); !r) return r;
    }
    v.applied_debug.reset();
  }
  if (g_kick_target.load()) g_kick_target.store(&cpu());
  ended_.reset();
  return {};
}

}  // namespace deja
