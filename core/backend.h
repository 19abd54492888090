// The vCPU backend interface: a vCPU that runs until a typed exit. KVM (kvm/) and the software CPU (interp/) implement it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <span>
#include <string_view>
#include <vector>

#include "core/cpu_state.h"
#include "core/error.h"
#include "core/progress_counter.h"

namespace deja {

enum class ExitKind : uint8_t {
  kIoIn,              // port read: the VMM sets `value` (size bytes, zero-extended) before the next run()
  kIoOut,             // port write of `value`
  kMmioRead,          // read of `address` outside RAM: VMM sets `value`
  kMmioWrite,         // write of `value` to `address`
  kHlt,               // HLT executed with no interrupt deliverable; RIP is past the HLT
  kRdtsc,             // RDTSC (or RDTSCP, see `is_rdtscp`): VMM sets `value` (the 64-bit TSC)
  kRdrand,            // RDRAND/RDSEED (see `is_rdseed`): VMM sets `value` and `ok` (CF)
  kMsrRead,           // RDMSR of an MSR the backend does not own: VMM sets `value`, or `fault` for #GP
  kMsrWrite,          // WRMSR of `value` to such an MSR: VMM may set `fault` for #GP
  kInterruptWindow,   // the guest can now accept an interrupt (requested with request_interrupt_window)
  kKicked,            // run() returned because kick() was called or the instruction budget ran out
  kDebug,             // single-step completed or breakpoint reached (set_debug)
  kCoordinateReached, // CoordinateSeeker: the target coordinate was reached exactly
  kCoordinateMissed,  // CoordinateSeeker: the vCPU went past the target without reaching it (`detail`)
  kShutdown,          // triple fault: the VM cannot continue
  kFault,             // failed entry, internal error, or unimplemented state: `detail` says what
  kPause,             // PAUSE retired (with set_pause_exits): a spin-wait hint; RIP is past it, `rip` the PAUSE
  kLocked,            // a locked instruction retired (with set_lock_exits); RIP is past it, `rip` the instruction
};

std::string_view exit_kind_name(ExitKind kind);

struct VcpuExit {
  ExitKind kind = ExitKind::kFault;
  uint16_t port = 0;       // kIoIn / kIoOut
  uint8_t size = 0;        // access size in bytes: 1, 2, 4 (or 8 for MMIO)
  uint64_t address = 0;    // kMmioRead / kMmioWrite: guest-physical address
  uint32_t msr = 0;        // kMsrRead / kMsrWrite
  uint64_t value = 0;      // data written by the guest, or to be returned to it
  uint64_t rip = 0;        // address of the instruction that caused the exit (I/O, MMIO, MSR, RDTSC, RDRAND, HLT);
                           // for kMmioWrite the next instruction's: KVM completes an MMIO write before it exits
  bool ok = true;          // kRdrand: the CF the guest sees
  bool fault = false;      // kMsrRead / kMsrWrite: the VMM answers #GP
  bool is_rdtscp = false;  // kRdtsc came from RDTSCP (the backend loads TSC_AUX into ECX itself)
  bool is_rdseed = false;  // kRdrand came from RDSEED
  // kDebug: a watchpoint (DebugControl::watchpoints) was hit by the instruction that just completed;
  // `address` is the first byte of the access inside the watched range, `rip` the accessing instruction.
  bool watch_hit = false;
  uint8_t watch_kind = 0;  // a WatchKind
  std::string detail;      // kShutdown / kFault: what happened, for the diagnostic
};

// Where an asynchronous event lands (see docs/coordinates.md). `branches` counts retired
// conditional branches on this vCPU since reset; the registers make the point unique.
struct Coordinate {
  uint32_t vcpu = 0;
  uint64_t branches = 0;
  uint64_t rip = 0;
  uint64_t rcx = 0;
  bool operator==(const Coordinate&) const = default;
};

// A data watchpoint on guest-linear addresses (gdb's Z2 write, Z3 read, Z4 access).
enum class WatchKind : uint8_t { kWrite = 2, kRead = 3, kAccess = 4 };
struct Watchpoint {
  uint64_t address = 0;
  uint64_t length = 1;
  WatchKind kind = WatchKind::kWrite;
  bool operator==(const Watchpoint&) const = default;
};

// The VMM's own debug controls (not the guest's debug registers, which stay the guest's).
struct DebugControl {
  // run() returns kDebug after one instruction, or one iteration of a REP string instruction.
  bool single_step = false;
  // The single step is the trap flag's, as KVM's is (KVM_GUESTDBG_SINGLESTEP): RFLAGS.TF, set by the VMM at every
  // run() (not after a kick) and hidden from get_state(), traps after an instruction that began with it, so a step is
  // not reported after an instruction that clears it (SYSRET loads RFLAGS from R11, SYSCALL masks it with FMASK, MOV SS
  // holds the trap one instruction, delivery through a gate clears it), and the vCPU then runs unstepped to its next
  // exit; the guest sees it (PUSHF, the RFLAGS a gate pushes, SYSCALL's R11) and IRET or POPF can bring it back. The
  // KVM backend's step is this whatever the flag says; the software CPU's, without it, stops after every instruction
  // and every exception delivery (trace header window_steps_trap_flag).
  bool step_as_trap_flag = false;
  // run() returns kDebug before executing the instruction at this linear address (a fault-like
  // instruction breakpoint; to continue past it, clear it and single-step once).
  std::optional<uint64_t> breakpoint;
  // More instruction breakpoints (the debugger's), with the same meaning.
  std::vector<uint64_t> breakpoints;
  // run() returns kDebug (watch_hit) after an instruction that accessed one of these ranges. Backends
  // without data watchpoints refuse a non-empty list in set_debug().
  std::vector<Watchpoint> watchpoints;
  // run() returns kDebug once step_count() reaches this (backends with a step count only).
  std::optional<uint64_t> stop_at_step;
  bool operator==(const DebugControl&) const = default;
};

// QEMU's TCG (the CPU of the nested-KVM harness, and of any KVM nested in QEMU without hardware virtualization)
// sets a descriptor's accessed bit only for MOV/POP Sreg and LxS; far JMP/CALL/RET, IRET and event delivery
// leave it clear where the SDM (vol. 3A 3.4.5.1) and real processors set it. Linux's per-CPU GDT shows it.
inline constexpr std::string_view kCpuQuirkAccessedBitOnlyBySegmentLoads = "accessed-bit-only-by-segment-loads";
// QEMU's TCG (7.2) keeps no x87 last-instruction pointers: FXSAVE writes FIP and FDP as zero and leaves FOP as it was.
inline constexpr std::string_view kCpuQuirkFxsaveNoX87Pointers = "fxsave-no-x87-pointers";
// QEMU's TCG writes only the 10 register bytes of each 16-byte x87 slot: FXSAVE leaves bytes 10-15 as they were.
inline constexpr std::string_view kCpuQuirkFxsaveSkipsReservedBytes = "fxsave-skips-reserved-bytes";
// QEMU's TCG (7.2) writes the x87 environment of FNSTENV/FNSAVE with its words zero-extended (processors set the
// reserved upper halves of the 28-byte form to ones), FIP as processors do, and FOP, FCS, FDP and FDS as zero.
inline constexpr std::string_view kCpuQuirkX87EnvironmentZeroExtended = "x87-environment-zero-extended";

// The software CPU's TLB (interp): direct-mapped, this many entries. Part of its machine model (a stale entry,
// and the accessed bits a walk sets, are guest-visible), so a trace records it (MachineConfig.software_tlb_entries)
// and a replay on the software CPU adopts it. Traces before the field had 256.
inline constexpr uint32_t kSoftwareTlbEntries = 2048;
inline constexpr uint32_t kSoftwareTlbEntriesBeforeRecorded = 256;
inline constexpr uint32_t kSoftwareTlbMaxEntries = 2048;

// x86-TSO store buffers on the software CPU (`--tso`, docs/explore.md "Store buffers"): part of the machine model a
// trace records (MachineConfig.tso), since which loads see which stores depends on them. Each store of a vCPU leaves
// its buffer, in order, once a delay drawn uniformly from [1, 2 drain_mean] of the vCPU's retired instructions since it
// was made has passed (a generator seeded with `seed` and the vCPU's index), at once when the buffer holds `capacity`
// stores, and with all the others at every ordering point.
struct StoreBufferPlan {
  static constexpr uint32_t kDefaultCapacity = 50;   // about what x86 cores have (Skylake: 56, Zen 2: 48)
  static constexpr uint32_t kDefaultDrainMean = 64;  // retired instructions a store waits, on average
  uint64_t seed = 0;
  uint32_t capacity = kDefaultCapacity;
  uint32_t drain_mean = kDefaultDrainMean;
  bool operator==(const StoreBufferPlan&) const = default;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;

  // True when every RDTSC the guest executes comes back as a kRdtsc exit, so its value passes the engine
  // (the software CPU; KVM with the kvm-deja module). Otherwise the guest reads a TSC deja never sees.
  virtual bool traps_rdtsc() const { return true; }
  // Why traps_rdtsc() is false, for messages.
  virtual std::string rdtsc_untrapped_reason() const { return {}; }

  // Where this vCPU departs from the architecture in a way guest memory shows (kCpuQuirk* names), as
  // measured on the host: recorded in the trace header so that a replay on another backend can do the same.
  virtual std::vector<std::string> cpu_quirks() const { return {}; }
  // Behave like a vCPU with these quirks (replay of a trace recorded with them); refused where impossible.
  virtual Result<> adopt_cpu_quirks(std::span<const std::string> quirks) {
    if (quirks.empty()) return {};
    return fail(ErrorKind::kUnsupported, "the {} backend cannot reproduce CPU quirk {}", name(), quirks.front());
  }

  // The software TLB's size of the machine a trace was recorded on (a power of two, kSoftwareTlbEntries by
  // default). A backend whose TLB is the hardware's has no such parameter and ignores it.
  virtual Result<> adopt_software_tlb_entries(uint32_t /*entries*/) { return {}; }

  // Runs the vCPU until the next exit. The returned exit stays valid, and the VMM fills its
  // response fields (value / ok / fault), until the next run(). Errors are host failures only;
  // guest-caused stops are exits (kShutdown, kFault).
  virtual Result<VcpuExit*> run() = 0;

  virtual Result<CpuState> get_state() = 0;
  virtual Result<> set_state(const CpuState& state) = 0;

  // Interrupts. deja has no in-kernel irqchip: the VMM's PIC chooses a vector and injects it.
  // True when an external interrupt injected now would be delivered before the next instruction
  // (RFLAGS.IF set, no STI/MOV SS shadow, no event already pending).
  virtual bool can_inject_interrupt() = 0;
  virtual Result<> inject_interrupt(uint8_t vector) = 0;
  // Raises NMI (an NMI message from the vCPU's local APIC): delivered through vector 2 at the next instruction
  // boundary where NMIs are not blocked (they are from an NMI's delivery to the next IRET), waking a HLT.
  virtual Result<> inject_nmi() {
    return fail(ErrorKind::kUnsupported, "the {} backend cannot deliver an NMI", name());
  }
  // Every PAUSE returns a kPause exit once it retired (a multiprocessor's scheduler sees spin-waits: docs/smp.md).
  virtual Result<> set_pause_exits(bool on) {
    if (!on) return {};
    return fail(ErrorKind::kUnsupported, "the {} backend cannot stop at PAUSE", name());
  }
  // Answers RDTSC and RDTSCP from `tsc` (the VMM's derived clock, which reads instruction_count()) inside run(),
  // without a kRdtsc exit: where the time follows from instructions and the recording logs no event for it, an exit
  // would be a run-loop trip for nothing (Linux's TSC delay loops make millions). An empty function: exit again.
  // Returns false where the backend cannot (it then exits as before).
  virtual bool answer_rdtsc_inline(std::function<uint64_t()> /*tsc*/) { return false; }
  // Every locked instruction (LOCK prefix, XCHG with memory) returns a kLocked exit once it retired: a scheduling
  // event of exploration's PCT schedule (docs/explore.md). Off unless a schedule asks: it costs an exit each.
  virtual Result<> set_lock_exits(bool on) {
    if (!on) return {};
    return fail(ErrorKind::kUnsupported, "the {} backend cannot stop at locked instructions", name());
  }
  // Ask for a kInterruptWindow exit as soon as can_inject_interrupt() would become true.
  virtual void request_interrupt_window(bool enable) = 0;

  // Makes a current or the next run() return kKicked soon. Thread- and async-signal-safe.
  virtual void kick() = 0;

  // Exact progress, where the backend has it (interp always; KVM with a usable PMU), else nullptr.
  virtual ProgressCounter* progress_counter() = 0;
  std::optional<uint64_t> branch_count() {
    ProgressCounter* counter = progress_counter();
    return counter ? std::optional<uint64_t>(counter->read()) : std::nullopt;
  }
  virtual std::optional<uint64_t> instruction_count() const = 0;
  // Single-step and instruction breakpoint, reported as kDebug exits.
  virtual Result<> set_debug(const DebugControl& control) = 0;

  // Deterministic timeslices: run() returns kKicked once `n` more instructions have retired (0: no budget), so the
  // run loop stops where derived time reaches a device deadline, or where a replay's End lies between guest exits.
  // A backend that cannot stop at an instruction count (KVM) says so, whatever `n`.
  virtual Result<> set_instruction_budget(uint64_t /*n*/) {
    return fail(ErrorKind::kUnsupported, "the {} backend cannot stop at an instruction count", name());
  }
  // Makes the progress counter behave like a hardware PMU whose overflow lands up to `skid` branches late (drawn
  // from a generator seeded with `seed`): CoordinateSeeker's skid handling, tested without a PMU. Software CPU only.
  virtual Result<> emulate_pmu_skid(uint64_t /*skid*/, uint64_t /*seed*/) {
    return fail(ErrorKind::kUnsupported, "the {} backend has a real progress counter or none to emulate a PMU with",
                name());
  }
  // What the backend adds to a run's statistics (`--stats`): one line each, indented lines belonging to the line
  // above.
  virtual std::vector<std::string> statistics() const { return {}; }

  // ---- checkpoints and time travel (snapshot/, replay/replay_timeline.h) ----------------------------
  // Steps executed since reset: instructions retired or faulted and single REP iterations, each one
  // kDebug stop under single_step. The debugger's time axis; nullopt where the backend cannot count.
  virtual std::optional<uint64_t> step_count() const { return std::nullopt; }
  // Backend state outside CpuState that a checkpoint must carry (pending events, counts), taken and
  // put back between run() calls with no exit outstanding. Encoded with StateWriter; restore refuses
  // a blob of another backend.
  virtual std::vector<uint8_t> save_internal() { return {}; }
  virtual Result<> restore_internal(std::span<const uint8_t> state) {
    if (state.empty()) return {};
    return fail(ErrorKind::kInvalidArgument, "{}: this backend keeps no internal state to restore", name());
  }
  // Dirty tracking for incremental checkpoints: after start_dirty_log(), every page the guest writes
  // ends up marked in GuestMemory's dirty bitmap by the next sync_dirty_log() at the latest. The
  // software CPU marks its stores directly (both are no-ops); KVM uses the dirty log.
  virtual Result<> start_dirty_log() { return {}; }
  virtual Result<> sync_dirty_log() { return {}; }
};

}  // namespace deja
