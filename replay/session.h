// Session: one machine, its engine and the run loop that run, record and replay share.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "replay/coordinate_seeker.h"
#include "replay/digest.h"
#include "replay/engine.h"
#include "vmm/host_io.h"
#include "boot/loader.h"
#include "vmm/machine.h"
#include "replay/progress_choice.h"
#include "replay/scheduler.h"
#include "snapshot/checkpoint.h"

namespace deja {

// How a run ended.
struct Outcome {
  int status = 0;
  std::string reason;         // "guest exit", "triple fault", ...
  bool guest_exit = false;    // ended through isa-debug-exit
  bool recorded_end = false;  // replay reached the End of a recording that stopped here (e.g. interrupted)
  // Run / record: a host facility the run needs failed (a disk overlay, the serial output file); `status` is
  // kInterrupted, what a replay of the recording that ends here ends with, and `reason` says what failed.
  bool host_failure = false;
};

// What Session::run_until stops at; every condition given applies. Run and record stop only when interrupted.
struct StopRequest {
  std::optional<uint64_t> at_step;   // Backend::step_count() reaches this (single step: now + 1)
  std::optional<uint64_t> at_event;  // the engine has processed this many trace events
  std::vector<uint64_t> breakpoints;       // linear RIPs; one under the starting point is stepped over
  std::vector<Watchpoint> watchpoints;     // guest-linear ranges
  bool stop_at_start_breakpoint = false;   // a breakpoint under the starting point stops at once
  std::function<bool()> interrupted;       // polled now and then: true stops with kInterrupted
};

struct StopReason {
  enum class Kind { kStep, kEvent, kBreakpoint, kWatchpoint, kInterrupted, kEnd };
  Kind kind = Kind::kEnd;
  uint64_t watch_address = 0;  // kWatchpoint: the accessed address (the access happened in the last step)
  WatchKind watch_kind = WatchKind::kWrite;
  uint64_t watch_rip = 0;      // kWatchpoint: the instruction that accessed it
  Outcome outcome;             // kEnd: how the replay ended (guest exit, end of trace, divergence)
};

// SIGINT/SIGTERM stop the session that is running (kicking its vCPU); a recording is still finished.
void install_stop_signal_handlers();
// What SIGINT does, from any thread (tests).
void request_stop();

class Session {
 public:
  Session(Mode mode, ProgressMode progress);
  ~Session();

  Engine& engine() { return engine_; }

  // Builds the machine, loads the image (with its modules, or a Linux kernel with its initrd) and sets the vCPU
  // to its entry state: build_machine() then load_image().
  Result<> build(const MachineConfig& config, const std::string& serial_out, std::span<const uint8_t> image,
                 const std::string& image_name, const LoadOptions& load,
                 std::span<const std::vector<uint8_t>> modules, std::span<const uint8_t> initrd = {});
  // The machine with its vCPUs in their reset state, the application processors waiting for STARTUP. A replay that
  // restores a checkpoint before it runs stops here: the checkpoint replaces all of RAM and every vCPU's state, so
  // loading the image (for a bzImage, decompressing its payload) would be work thrown away.
  Result<> build_machine(const MachineConfig& config, const std::string& serial_out);
  // Writes the image into RAM and sets the boot vCPU to its entry state.
  Result<> load_image(std::span<const uint8_t> image, const std::string& image_name, const LoadOptions& load,
                      std::span<const std::vector<uint8_t>> modules, std::span<const uint8_t> initrd = {});
  // The loaded image's format ("multiboot-elf32", "linux-pvh", ...), once built.
  const std::string& image_format() const { return image_format_; }

  // Exact mode: attaches the counter that places events (emulated PMU, host PMU) and, in replay, the seeker.
  Result<> setup_progress(const ProgressChoice& choice);
  // Time read inside the guest's run follows from the instruction count (Engine::derive_time): fails on a backend
  // that does not count instructions.
  Result<> derive_time(Engine::TimeRates rates);
  // Exact mode: what counts progress (for the trace header and messages).
  std::string counter_description();
  // Several vCPUs: how they take turns (docs/smp.md); the unit is the progress mode's. Call after build().
  Result<> set_schedule(const ScheduleConfig& config);
  const Scheduler* scheduler() const { return scheduler_.get(); }
  // The vCPU running now (or that last ran).
  uint32_t current_vcpu() const { return current_; }

  void attach_input(std::unique_ptr<HostInput> input) { input_ = std::move(input); }
  // RDTSC/RDRAND exits count as guest-caused exits (trace header rdtsc_exits_are_guest_exits): they are
  // instruction-synchronous wherever the backend traps them, so exit-synchronous recording can deliver
  // interrupts there too. Recording turns it on where the backend traps RDTSC; replay as the trace says.
  // Off, with derived time, the software CPU answers RDTSC without an exit (answer_rdtsc_inline): no guest exit to
  // count, no event to log, no run-loop trip.
  void count_rdtsc_as_guest_exits(bool on);
  bool rdtsc_exits_are_guest_exits() const { return rdtsc_exits_are_guest_exits_; }
  // Until the vCPU runs again after an MMIO-write exit, its state counts as after the writing instruction (trace
  // header mmio_write_exits_complete): KVM completes an MMIO write before it exits, the software CPU finishes the
  // instruction when it runs again, so coordinates and digests there take the exit's RIP (comparable_state()).
  // Recording turns it on; replay as the trace says.
  void complete_mmio_write_exits(bool on) { mmio_write_exits_complete_ = on; }
  bool mmio_write_exits_complete() const { return mmio_write_exits_complete_; }
  // Exit-synchronous progress with several vCPUs (trace header interrupt_window_steps): an interrupt pending at a
  // guest-caused exit where the vCPU cannot take it (RFLAGS.IF clear, an STI shadow), kBlockedExitsBeforeSteps
  // exits in a row, is delivered at the first instruction boundary after the last where it can, found by
  // single-stepping the vCPU, at most `steps` instructions (then at a later guest-caused exit). A vCPU waiting for another with interrupts off between its exits (Linux's
  // schedule() loop while an AP boots: RDTSC in sched_clock only with IF clear) would otherwise never take its timer.
  // Recording sets it; replay as the trace says (0: off, as before).
  void step_to_interrupt_windows(uint32_t steps) { interrupt_window_steps_ = steps; }
  uint32_t interrupt_window_steps() const { return interrupt_window_steps_; }
  // The steps of a window search are the trap flag's on every backend (trace header window_steps_trap_flag): KVM's
  // are, and a step the trap flag does not give (after SYSRET, SYSCALL, an exception's delivery) cannot be added
  // there, so the software CPU leaves it out too. Recording turns it on; replay as the trace says (off: the software
  // CPU steps every instruction, as before the field).
  void step_windows_by_trap_flag(bool on) { window_steps_trap_flag_ = on; }
  bool window_steps_by_trap_flag() const { return window_steps_trap_flag_; }
  static constexpr uint32_t kInterruptWindowSteps = 16384;
  static constexpr uint32_t kBlockedExitsBeforeSteps = 64;
  // The disk images behind MachineConfig::disks, kept alive with the machine (call before build()).
  void adopt_disks(std::vector<std::unique_ptr<DiskImage>> disks) { disks_ = std::move(disks); }
  std::vector<std::unique_ptr<DiskImage>>& disks() { return disks_; }
  Machine& machine() { return *machine_; }
  uint64_t serial_bytes() const;
  // Events between two state digests; the trace's header says which a recording used.
  static constexpr uint64_t kDefaultDigestInterval = 16384;
  void set_digest_interval(uint64_t n) { digest_interval_ = n; }
  uint64_t digest_interval() const { return digest_interval_; }

  // Runs, records or replays to the end: run_until() with no stop but an interruption.
  Result<Outcome> run();
  // Record: ends the trace with an End where the run stopped (its coordinate, instruction count, exit status and
  // full state digest) and the footer; returns the footer as stated (before the writer adds its index), which a
  // signature covers.
  Result<trace::Footer> finish_recording(const Outcome& outcome);
  // Run / record: the host failure that stopped the run or lost some of its output (a disk overlay or the serial
  // output file that could not be written), or "".
  std::string host_failure() const;
  // Replay: the guest stopped at the recording's End (or at its own exit). Compares everything the End
  // carries with where the replay got: exit status, guest-exit count, instruction count, the full state
  // digest, and the serial output so far. A mismatch is reported as divergence. Returns the digest.
  Digest check_replay_end(const trace::End& end, const Outcome& outcome);
  void print_stats();
  Digest final_cpu_ram_digest();
  Digest final_machine_digest();
  // Per vCPU, for statistics and inspect: instructions, branches and guest exits so far.
  struct VcpuCounts {
    uint64_t instructions = 0, branches = 0, guest_exits = 0;
  };
  VcpuCounts vcpu_counts(uint32_t vcpu);
  uint64_t wall_ns() const { return wall_ns_; }
  Position current_position() { return position(); }

  // ---- the steppable replay (deja debug, deja query): rr's ReplaySession ---------------------------
  // Runs until one of `stop`'s conditions holds or the run ends: the one run loop, which run() drives too. In
  // replay, stops are decided at one point of the loop, before the recorded events that land there are applied,
  // so that reaching a point by stepping, by seeking or after a checkpoint restore gives the same state.
  Result<StopReason> run_until(const StopRequest& stop);
  // Where the replay stands (between run_until() calls).
  CheckpointPosition checkpoint_position();
  // The complete machine state now (between run_until() calls); memory through `memory`'s images.
  Result<MachineCheckpoint> capture_checkpoint(CheckpointMemory& memory);
  // Puts the machine, the engine's trace cursor and the loop state back to `checkpoint`.
  Result<> restore_checkpoint(const MachineCheckpoint& checkpoint, CheckpointMemory& memory);
  // The same without memory (checkpoint.memory stays null), for checkpoints that keep RAM their own way (segments/):
  // the caller captures RAM with it, or has put it back before restore_state().
  Result<MachineCheckpoint> capture_state();
  Result<> restore_state(const MachineCheckpoint& checkpoint);
  // The loop state every replay that reaches this point shares, however it got there (state digests, segments/):
  // guest exits, the next digest's event count, events taken, derived time. Not the trace cursor's read-ahead, the
  // serial-output comparison or the last exit, which differ between a recording, a replay and a restored replay.
  std::vector<uint8_t> shared_loop_state() const;
  // Record: `hook` runs at the top of every turn where a checkpoint can be taken (the instruction the last exit
  // interrupted is complete, as where a replay stops), before anything else of the turn; an error stops the run.
  // A replay that stops at the same step count stands at the same state there (checkpoints taken while recording,
  // segments/).
  void set_record_turn_hook(std::function<Result<>()> hook) { record_turn_hook_ = std::move(hook); }
  // The replay has ended (run_until returned kEnd) and not been restored since.
  const std::optional<Outcome>& replay_ended() const { return ended_; }

  // ---- exploration (docs/explore.md): runs that end by themselves ---------------------------------------------
  // Run / record: the run ends (and a recording with it, its End here: a replay stops at the same point) at the top
  // of a turn once the machine has retired `max_steps` instructions (0: no limit), or `hang_steps` without serial
  // output, or when `stop` gives a reason. With a simulated host (Engine::simulate_host) a wait in HLT that lasts
  // `max_idle_ns` of guest time with nothing to wake the guest is a hang too. Every limit is counted in the guest's
  // own progress, so the same run stops at the same instruction.
  struct RunLimits {
    uint64_t max_steps = 0;
    uint64_t hang_steps = 0;
    uint64_t max_idle_ns = 0;
    std::function<std::optional<std::string>()> stop;
  };
  void set_run_limits(RunLimits limits) { limits_ = std::move(limits); }
  // Exploration's injected faults: the engine decides them for every disk (call after build()).
  void set_fault_plan(const FaultPlan& plan);
  // The guest's serial output as it is written (after the serial sink and the engine).
  void set_serial_tap(std::function<void(std::span<const uint8_t>)> tap);
  // The reasons a run ended by its limits start with these (an Outcome's reason).
  static constexpr std::string_view kHangReason = "hang: ", kLimitReason = "limit: ";
  // Scheduling-relevant events so far (PAUSEs, device accesses, interrupts: what a PCT schedule counts).
  uint64_t schedule_events() const { return schedule_events_; }
  // Where the schedule's policy preempted a vCPU at a scheduling event (PCT's change points; the first 4096).
  struct Preemption {
    uint32_t vcpu = 0;
    uint64_t rip = 0;
    uint64_t event = 0;         // its number among the scheduling events, from 1
    uint32_t change_point = 0;  // by its draw: the bit of ScheduleConfig::dropped_change_points that leaves it out
  };
  const std::vector<Preemption>& preemptions() const { return preemptions_; }

  // Progress lines (tools/progress_line.h): the run loop calls `hook` at most every 100 ms of host time.
  void set_progress_hook(std::function<void()> hook) { progress_hook_ = std::move(hook); }

 private:
  class TeeSink;

  // Wires or unwires every vCPU's inline RDTSC (count_rdtsc_as_guest_exits) as derived time and the flag allow.
  void answer_rdtsc_inline_where_possible();
  // Schedule version 1: the running vCPU's PAUSEs exit only while another vCPU is runnable.
  Result<> follow_company();

  Position position();
  // A vCPU's state as coordinates and digests see it (the same on both backends at an MMIO-write exit).
  Result<CpuState> comparable_state(uint32_t vcpu);
  // Every vCPU's, vCPU 0's first.
  std::vector<CpuState> comparable_states();
  bool guest_caused(ExitKind kind) const;
  // A received frame as apply_async hands it to its NIC (bytes owned by the caller).
  struct FrameIn {
    unsigned nic;
    std::span<const uint8_t> data;
  };
  // Run / record: let host time and host input in if anything is due. `idle`: the guest waits in HLT, where virtual
  // time catches up with host time; else, with derived time, a deadline is due when derived time reaches it.
  void poll_async(bool idle = false);
  // Scripted serial input (a simulated host's) still to arrive after the guest's present: a wait or a slice ends there.
  std::optional<uint64_t> scripted_input_arrival();
  std::vector<NetFrameIn> take_network_frames(uint64_t now);
  // A simulated host's networks: when the next of them has work (a frame arriving, a timer); nullopt, none.
  std::optional<uint64_t> next_network_ns();
  bool async_work_due();
  // The backend stops at an instruction count (Backend::set_instruction_budget).
  bool has_budget_ = false;
  // Derived time (run / record): the vCPU stops by an instruction budget where virtual time reaches the next device
  // deadline.
  bool derived_budget_ = false;
  void apply_async(uint64_t now_ns, std::span<const uint8_t> input, std::span<const FrameIn> frames = {});
  void replay_async();
  Result<> deliver_interrupts();
  // Several vCPUs (docs/smp.md): applies the NMI, INIT and STARTUP signals the APIC bus holds, and switches to the
  // next vCPU when the running one ran its slice, its PAUSEs, or cannot run. A value: the machine stops.
  Result<std::optional<Outcome>> schedule();
  // Whether vCPU `v` can run: started, and not halted unless something wakes it (an interrupt it can take, an NMI).
  bool runnable(uint32_t v);
  bool any_runnable();
  // Why no vCPU can ever run again (each halted with interrupts disabled, or waiting for STARTUP), if so.
  std::optional<std::string> machine_stuck();
  uint32_t cpu_signature() const;
  // Makes `v` the running vCPU, with a new slice.
  void switch_to(uint32_t v);
  // Sum of every vCPU's steps: the debugger's time axis with several vCPUs (one vCPU's step_count() with one).
  uint64_t total_steps();
  Result<std::optional<Outcome>> handle_exit(VcpuExit& exit);
  // Run / record with limits: the Outcome the run ends with here, if a limit is reached.
  std::optional<Outcome> limit_reached();
  // Several vCPUs: a scheduling-relevant event on the running vCPU, which a policy may preempt it at.
  void schedule_event(ScheduleEvent event, uint64_t rip);
  Result<std::optional<Outcome>> wait_for_wake();
  void maybe_digest();
  void start_kicker();
  void stop_kicker();
  // The state of one run_until() call between the turns of its loop (a vCPU's, when there are several).
  struct Turn {
    uint64_t start_step = 0;                 // a breakpoint here is left with one step, not reported
    std::optional<StopReason> watch_stop;    // a watched access happened in the last step
    bool step_over = false;                  // this turn leaves the starting breakpoint
    bool finish_instruction = false;         // a stop is due, after the instruction the last exit left unfinished
  };
  // One turn of the loop: stops due, the recorded events that land here (replay) or host time and input (run,
  // record), interrupts, the vCPU's run to its next exit and that exit's handling. A value: the loop stops.
  Result<std::optional<StopReason>> step(const StopRequest& stop, Turn& turn);
  // Replay: the first of `stop`'s conditions that holds here (sets turn.step_over).
  std::optional<StopReason> due_stop(const StopRequest& stop, Turn& turn);
  // Before the vCPU runs: where it is to stop by itself. Replay: the debugger's controls, the next recorded
  // event's coordinate (the seeker, exact mode) or the End's instruction count (exit-sync); run and record: the
  // next device deadline (an instruction budget where time is derived, else a kick at its host time), input and
  // network polls, heartbeats.
  Result<> aim(const StopRequest& stop, const Turn& turn);
  // Exact replay: the coordinate of the next positional event or of the End, and how to tell its visits apart.
  std::optional<SeekTarget> seek_target();
  // Replay: the next event, if it is an End placed at a coordinate (not reached through the guest's exit port).
  const trace::End* positional_end();
  std::optional<Outcome> replay_end_here();
  Result<std::vector<uint8_t>> encode_loop_state();
  Result<> decode_loop_state(std::span<const uint8_t> blob);
  Result<> apply_debug(const DebugControl& control);
  // The exit's instruction is completed by the next run() (its response is still to be delivered).
  static bool completes_on_next_run(ExitKind kind);

  // One vCPU's place in the run loop: its counts, its last exit, its seeker and debug controls.
  struct Vcpu {
    Backend* cpu = nullptr;
    uint64_t guest_exits = 0;
    ExitKind last_exit_kind = ExitKind::kKicked;
    uint64_t last_exit_rip = 0;
    bool after_mmio_write = false;  // the last exit was an MMIO write and the vCPU has not run since
    bool halted = false;            // its last exit was HLT, and nothing has woken it since
    bool seeking_window = false;    // single-stepped to where it can take the pending interrupt (step_to_...)
    uint32_t window_steps = 0;      // steps taken so far for the pending interrupt
    uint32_t blocked_exits = 0;     // guest exits at which it could not take the pending interrupt
    std::unique_ptr<CoordinateSeeker> seeker;  // replay in exact mode
    std::optional<DebugControl> applied_debug;  // run_until without a seeker: what the backend has
    std::map<ExitKind, uint64_t> exit_counts;
  };
  Vcpu& now() { return vcpus_[current_]; }
  Backend& cpu() { return *vcpus_[current_].cpu; }

  Engine engine_;
  std::string image_format_;
  bool cpu_has_nx_ = true;  // the machine's CPU model has NX: the loader's entry state sets EFER.NXE
  std::unique_ptr<FileSink> out_;
  std::unique_ptr<TeeSink> tee_;
  std::vector<std::unique_ptr<DiskImage>> disks_;  // before machine_: its disks refer to them
  std::unique_ptr<Machine> machine_;
  std::unique_ptr<HostInput> input_;
  std::vector<Vcpu> vcpus_;
  uint32_t current_ = 0;
  // Several vCPUs: the schedule, and where the running vCPU's slice ends (its step count, or its guest-exit count
  // in exit-sync mode) and how many PAUSEs it has left.
  std::unique_ptr<Scheduler> scheduler_;
  uint64_t slice_end_ = 0;
  uint32_t pauses_left_ = 0;
  uint64_t schedule_events_ = 0;
  std::vector<Preemption> preemptions_;
  std::optional<RunLimits> limits_;
  uint64_t limit_serial_seen_ = 0, limit_progress_step_ = 0;
  bool kicked_ = false;  // the running vCPU's last exit was a kick (a plain run in guest-exit slices switches there)
  static constexpr uint64_t kRunSliceNs = 4'000'000;
  std::vector<uint64_t> saved_branches_;  // decode_loop_state(): each vCPU's branch count, for its counter
  uint64_t digest_interval_ = kDefaultDigestInterval;
  uint64_t next_digest_at_ = kDefaultDigestInterval;
  uint64_t wall_ns_ = 0;
  bool warned_spin_ = false;
  bool rdtsc_exits_are_guest_exits_ = false;
  bool mmio_write_exits_complete_ = false;
  uint32_t interrupt_window_steps_ = 0;
  bool window_steps_trap_flag_ = false;
  uint64_t last_guest_exit_host_ns_ = HostClock::monotonic_ns();
  static constexpr uint64_t kSpinWarnNs = 1'000'000'000, kSpinStopNs = 10'000'000'000;
  static constexpr uint64_t kHeartbeatNs = 1'000'000'000;
  static constexpr uint64_t kHookSlowNs = 1'000'000;  // a record turn hook this slow did work (took a checkpoint)
  uint64_t next_heartbeat_ = 0;
  static constexpr uint64_t kNetPollNs = 1'000'000;
  static constexpr size_t kMaxFramesPerEvent = 256;
  uint64_t next_net_poll_ns_ = 0;

  void tick_progress() {
    if (!progress_hook_) return;
    const uint64_t now = HostClock::monotonic_ns();
    if (now < next_progress_ns_) return;
    next_progress_ns_ = now + kProgressIntervalNs;
    progress_hook_();
  }
  std::function<void()> progress_hook_;
  static constexpr uint64_t kProgressIntervalNs = 100'000'000;
  uint64_t next_progress_ns_ = 0;

  std::optional<Outcome> ended_;     // the run ended here (replay: until a checkpoint is restored)
  std::function<Result<>()> record_turn_hook_;

  std::thread kicker_;
  std::atomic<bool> kicker_stop_{false};
  std::atomic<uint64_t> kick_at_{UINT64_MAX};  // host monotonic ns
};

}  // namespace deja
