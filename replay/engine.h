// The record/replay engine: one choke point per kind of nondeterministic input, in mode run / record / replay.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "devices/device.h"
#include "logging/trace.pb.h"
#include "logging/trace_reader.h"
#include "logging/trace_writer.h"
#include "core/backend.h"
#include "core/seeded_random.h"
#include "replay/digest.h"
#include "vmm/disk_image.h"
#include "vmm/host_io.h"
#include "replay/stream_match.h"
#include "replay/network_link.h"
#include "vmm/user_network.h"

namespace deja {

enum class Mode { kRun, kRecord, kReplay };

// How asynchronous events (time passing, serial input, and the interrupts they raise) are placed.
enum class ProgressMode {
  kExact,     // at any instruction boundary, by (branches, RIP, RCX): interp
  kExitSync,  // only right after guest-caused exits (PIO, MMIO, HLT, MSR): KVM without a PMU
};
std::string_view progress_mode_name(ProgressMode mode);

// What the engine knows about "where the guest is" when an event happens.
struct Position {
  Coordinate at;
  uint64_t gpr_digest = 0;
  uint64_t guest_exits = 0;
  // Retired instructions, where the backend counts them (interp): not part of a coordinate (a PMU
  // cannot count them exactly), but heartbeats, digests and the End carry them and replay checks them.
  std::optional<uint64_t> instructions;
};

// Divergence: replay disagrees with the recording. Carries the report printed for the user.
struct Divergence {
  uint64_t event_index = 0;
  std::string report;
};

// The earlier of two times, either of which may be absent.
inline std::optional<uint64_t> earliest(std::optional<uint64_t> a, std::optional<uint64_t> b) {
  if (!a || !b) return a ? a : b;
  return std::min(*a, *b);
}

// A frame received from outside, for NIC `nic`: recorded inside an Async event.
struct NetFrameIn {
  unsigned nic = 0;
  std::vector<uint8_t> data;
};

// Exploration's faults (docs/explore.md), in parts per million of requests; recorded in the trace header
// (MachineConfig.faults) so that replay decides the same.
struct FaultPlan {
  uint64_t seed = 0;
  uint32_t disk_eio_ppm = 0;
  uint32_t disk_torn_ppm = 0;
  std::vector<uint64_t> suppressed;  // the disk faults drawn (by their order, from 0) that are not injected
  // Frames lost, delivered twice, and delivered late past later ones, each way between a NIC and its network (a
  // seeded run's: replay has no network, its frames are in the trace, so replay needs none of these).
  uint32_t net_drop_ppm = 0;
  uint32_t net_dup_ppm = 0;
  uint32_t net_reorder_ppm = 0;
  std::vector<uint64_t> net_suppressed;  // the network faults drawn (by their order, from 0) that are not injected
  bool any() const { return disk_eio_ppm || disk_torn_ppm || any_network(); }
  bool any_network() const { return net_drop_ppm || net_dup_ppm || net_reorder_ppm; }
  bool operator==(const FaultPlan&) const = default;
};

class Engine : public Clock, public Entropy, public NetworkPort, public DiskBlockChecker, public BlockFaults {
 public:
  Engine(Mode mode, ProgressMode progress);
  ~Engine() override;

  Mode mode() const { return mode_; }
  ProgressMode progress() const { return progress_; }

  void attach_writer(std::unique_ptr<TraceWriter> writer) { writer_ = std::move(writer); }
  void attach_reader(std::unique_ptr<TraceReader> reader) { reader_ = std::move(reader); }
  TraceReader* reader() { return reader_.get(); }
  const TraceWriter* writer() const { return writer_.get(); }

  // ---- choke points --------------------------------------------------------------------------
  // Device clock reads (Clock), an event each; or, with derive_time(), derived from the instruction count. While
  // an asynchronous event is processed, time is frozen at the event's time (no further clock events).
  uint64_t now_ns() override;
  // Value of a port / MMIO read: `device_value` is what the device model answered. Recorded; in
  // replay it is checked against the recording (a device-semantics change is a divergence).
  uint64_t port_read(uint16_t port, unsigned size, uint64_t device_value, uint64_t rip);
  uint64_t mmio_read(uint64_t address, unsigned size, uint64_t device_value, uint64_t rip);
  // RDTSC/RDTSCP and the TSC MSR: virtual time scaled to the model's TSC frequency, recorded as an event per read;
  // or, with derive_time(), derived from the instruction count, with no event.
  uint64_t rdtsc(uint64_t rip, bool rdtscp);
  // RDRAND/RDSEED: host entropy when recording, the trace when replaying.
  std::pair<uint64_t, bool> rdrand(uint64_t rip, bool rdseed);
  // Reads of time-dependent MSRs (the TSC).
  uint64_t msr_read(uint32_t msr, uint64_t rip, uint64_t live_value);
  // Reads of MSRs a device model answers (the local APIC's): recorded, and in replay checked
  // against the model's answer like a port read. Returns the value and whether it is #GP.
  std::pair<uint64_t, bool> device_msr_read(uint32_t msr, uint64_t device_value, bool device_fault, uint64_t rip);
  // An interrupt the PIC delivers now: recorded with its coordinate; checked in replay.
  void interrupt(uint8_t vector, const Position& where);
  // Serial output (not an input, but recorded so inspect can show it and replay can check it).
  void serial_output(std::span<const uint8_t> bytes);
  // Entropy (virtio-rng, engine_random.cpp): host bytes, recorded; replay hands back the recorded bytes.
  void fill(std::span<uint8_t> out) override;
  // A frame a NIC sent (engine_net.cpp): to the NIC's user-mode network (run, record; recorded with its length
  // and hash, which replay checks, and the frame itself, for inspect).
  void transmit(unsigned nic, std::span<const uint8_t> frame) override;
  // A lazily hashed disk block read for the first time (engine_block.cpp): recorded, checked in replay.
  Result<> check_disk_block(unsigned disk, uint64_t block, uint64_t hash) override;
  // A read or write of a disk's contents (engine_block.cpp): recorded as a disk_io event for inspect, like serial
  // output outside the event count; replay skips those events.
  void disk_io(unsigned disk, bool write, bool zeroes, uint64_t offset, uint64_t length) override;
  // Exploration: the faults disk requests suffer (engine_faults.cpp), a pure function of the plan, the request and
  // the derived-time state where it is served, which recording and replay share (and a checkpoint restores).
  void set_fault_plan(const FaultPlan& plan) { faults_ = plan; }
  const FaultPlan& fault_plan() const { return faults_; }
  BlockFault block_fault(unsigned disk, bool write, uint64_t sector, uint64_t sectors) override;
  uint64_t faults_injected() const { return faults_injected_; }
  // The faults drawn so far (those suppressed too; the first 4096 of each kind), each where it was decided: what
  // --minimize reports and takes away. Disk and network faults are numbered apart (replay draws the disk's again,
  // and has no network).
  struct FaultDrawn {
    bool network = false;
    uint64_t ordinal = 0;  // among the faults of its kind
    bool suppressed = false;
    std::string what;  // "disk 0 read sector 5600", "net 0 to the guest: frame 17 dropped"
    Position where;
  };
  const std::vector<FaultDrawn>& faults_drawn() const { return faults_drawn_; }
  // The disks' paths, for messages naming a block that differs.
  void set_disk_names(std::vector<std::string> names) { disk_names_ = std::move(names); }

  // The NICs' networks outside the machine (run and record only; replay has none), by NIC index.
  void attach_network(std::unique_ptr<UserNetwork> network) { networks_.push_back(std::move(network)); }
  std::vector<std::unique_ptr<UserNetwork>>& networks() { return networks_; }
  // A simulated host's networks (engine_net.cpp): each NIC reaches its network (restricted: nothing of the host's)
  // through a NetworkLink, a wire whose latency (up to the timer jitter) and faults (the plan's net-*) are drawn
  // from the seed. exchange_network() delivers the frames that have reached each network, runs the networks (their
  // timers, in derived time) and puts what they send on the wires; network_frames_arrived() takes the frames that
  // have reached a NIC. Called where asynchronous events may land, so that a run is a function of its seed.
  bool networks_simulated() const { return !links_.empty(); }
  // The networks' clock: host time; a simulated host's networks, the time exchange_network() last ran them at (a
  // halted guest's wait may run them ahead of derived time, which moves only at asynchronous events).
  uint64_t network_now_ns() { return networks_simulated() ? network_now_ns_ : host_now_ns(); }
  void exchange_network(uint64_t now_ns);
  std::vector<std::vector<uint8_t>> network_frames_arrived(unsigned nic, uint64_t now_ns, size_t max);
  // When NIC `nic`'s network next has something to do: a frame arriving either way (towards the NIC only while it
  // can take one), or the network's own timers. nullopt: nothing until the guest sends.
  std::optional<uint64_t> next_network_ns(unsigned nic, bool nic_can_receive) const;

  // A host failure found inside device work (a disk image that cannot be read): the run stops with it.
  void host_failure(const std::string& message) {
    if (host_error_.empty()) host_error_ = message;
  }
  const std::string& host_error() const { return host_error_; }

  // The TSC as the guest would read it now (run/record, or derived in any mode), for the TSC MSR.
  uint64_t tsc_now();

  // ---- derived time (format 4, docs/trace-format.md) ---------------------------------------------
  // On a backend that counts instructions exactly (interp), time read inside the guest's run needs no event:
  // between two asynchronous events (where host time enters, recorded) virtual time advances by
  // `ps_per_instruction` a retired instruction and `ns_per_device_read` a port, MMIO or device-MSR read (as on
  // hardware, where such a read takes about a microsecond: a loop polling a device for 20 ms then polls 20,000
  // times, not 5 million), the TSC with it (never less than its previous read + 1), and device clock reads see the
  // same. Replay computes the same values from the same events. A Linux guest reads the TSC tens of thousands of
  // times a second: logged, those reads were nine in ten events of its trace.
  struct TimeRates {
    uint32_t ps_per_instruction = 1000;  // a 1 G instructions/s CPU
    uint32_t ns_per_device_read = 1000;
  };
  void derive_time(TimeRates rates, std::function<std::optional<uint64_t>()> instructions);
  std::optional<TimeRates> derived_time_rates() const {
    return derived_ ? std::optional(derived_->rates) : std::nullopt;
  }
  // Run/record, while the guest runs: derived time where it is derived, else host time (no event either way).
  uint64_t running_now_ns() { return derived_ ? derived_now_ns() : host_now_ns(); }
  // Derived time: the instructions after which it reaches `ns` (at least 1).
  uint64_t instructions_until(uint64_t ns);
  // Derived time's state that the guest's own reads make (device reads; the anchor's time, instructions and device
  // reads; the last TSC read), zeros without it: what every replay that reaches this point has too.
  std::array<uint64_t, 5> derived_time_state() const;

  // ---- exploration (docs/explore.md) ----------------------------------------------------------------
  // Run and record with nothing from the host: host time is derived time (a wait in HLT ends when the next device
  // deadline is met, not after a host sleep), entropy and RDRAND come from a generator seeded with `seed`, and a
  // device deadline is met up to `max_timer_delay_ns` late, by an amount drawn from (seed, deadline): the timer and
  // interrupt jitter of a real machine, chosen by the seed. Needs derived time. A recording is still an ordinary
  // trace: what the generator handed out is recorded like host input, so replay needs neither the seed nor this.
  struct SimulatedHost {
    uint64_t seed = 0;
    uint64_t max_timer_delay_ns = 0;
  };
  Result<> simulate_host(SimulatedHost host);
  bool host_simulated() const { return simulated_.has_value(); }
  // When a device deadline is met: the deadline, or later by the simulated host's delay for it.
  uint64_t timer_due_ns(uint64_t deadline) const;

  // ---- asynchronous events (time advancing, host input arriving) ------------------------------
  // Record/run: what host time says now (virtual ns), without logging.
  uint64_t host_now_ns();
  // Record/run, while the guest waits in HLT: the time its wait has reached: host time, and never before the time
  // already handed out. Where host time is more than kCatchUpNs past `deadline` (the machine's next device deadline;
  // the software CPU runs slower than derived time's 1 G instructions/s, and a long busy stretch builds up a lag),
  // the wait ends at the deadline instead, not in one jump past every timer (which Linux reports as a CPU stall:
  // "rcu_preempt kthread timer wakeup didn't happen"), and the lag is dropped from host time (idle_lag_ns_), so that
  // later waits end at host-timed points again: where an interrupt lands stays what a real machine would make it.
  // A simulated host's networks' next work (`network_ns`) ends the wait too.
  uint64_t idle_now_ns(std::optional<uint64_t> deadline, std::optional<uint64_t> network_ns = std::nullopt);
  static constexpr uint64_t kCatchUpNs = 50'000'000;
  // Host monotonic time at which virtual time 0 was (virtual time follows host time when recording).
  uint64_t host_origin_ns() const { return host_clock_.origin_ns(); }
  // Record/run: host time the VMM spent on work of its own, which the guest's time leaves out (virtual time stands
  // still through it, as if that work took no time).
  void skip_host_time(uint64_t ns) { host_clock_.skip(ns); }
  // Record: log an async event at `where` (the session brackets the device work with begin/end_async).
  void record_async(const Position& where, uint64_t now_ns, std::span<const uint8_t> input,
                    std::span<const NetFrameIn> frames = {});
  // Record: a heartbeat (a coordinate without RAM digest) so that a truncated trace says how far
  // the guest got, and replay of it stops there.
  void record_heartbeat(const Position& where, uint64_t instructions);
  // Replay: events that happen at a position rather than at a choke point (async events and
  // heartbeats): the next one, whether it lands at `where`, and taking it.
  const trace::Event* next_positional();
  const trace::Coordinate& positional_at(const trace::Event& e) const;
  bool positional_matches(const trace::Event& e, const Position& where) const;
  // The instruction count a positional event was recorded at: heartbeats, and asynchronous events where time is
  // derived (0: not counted).
  static uint64_t positional_instructions(const trace::Event& e);
  trace::Event consume_positional();
  void begin_async(uint64_t now_ns);
  void end_async();

  // Replay: the next event (output events skipped and checked); nullptr at the end of the trace.
  const trace::Event* peek();
  const trace::End* expect_end(const std::string& what);
  // Record: log a state digest with its parts; replay: compare with the recorded one, and when they differ, name
  // the registers, RAM regions and devices (`device_names`, in the parts' order) that do.
  void record_digest(const Position& where, const Digest& digest, uint64_t instructions, const DigestParts& parts,
                     std::span<const std::string> device_names);

  // Finishes a recording: End event + footer.
  Result<> finish_record(trace::End end, trace::Footer footer);

  // Where the guest is now (for divergence reports); set by the session.
  void set_position_source(std::function<Position()> where) { where_ = std::move(where); }
  // The vCPU whose exits the choke points serve now (several vCPUs: docs/smp.md). Recorded in each event's
  // `vcpu` (absent for vCPU 0, so one-vCPU traces are what they were) and checked in replay.
  void set_vcpu(uint32_t vcpu) { vcpu_ = vcpu; }

  // Set when replay diverged (the session stops at the next opportunity).
  const std::optional<Divergence>& divergence() const { return divergence_; }
  void report_divergence(const std::string& what, const std::string& recorded, const std::string& replayed) {
    diverge(what, recorded, replayed);
  }
  // Replay reached the end of the readable trace (complete, truncated, or corrupt: see trace_error()).
  bool replay_exhausted() const { return exhausted_; }
  const std::string& trace_error() const { return trace_error_; }
  // Events recorded or replayed (serial output excluded).
  uint64_t events_processed() const { return events_; }
  // Record: every event written to the trace, serial output included (what `deja verify` counts).
  uint64_t events_written() const { return writer_ ? writer_->events_written() : events_; }
  // Record: the first error writing the trace (a full disk, a file-size limit); empty while all is well.
  const std::string& write_error() const { return write_error_; }
  // Record: the file the trace is being written to (the .partial one until it is complete).
  std::string trace_file() const { return writer_ ? writer_->path() : std::string(); }
  // Record, before the trace is complete: whether that file is still the one deja wrote (not removed, replaced or
  // changed by another program: logging/output_file.h), so that its prefix can be offered to the user.
  bool trace_intact() const { return writer_ && writer_->check_intact().has_value(); }

  // Replay: serial output the trace and the replay disagree on at the very end.
  void check_output_complete();

  // ---- time travel: the replay cursor (checkpoints save and restore it) -----------------------
  // Keeps every event read in memory from now on, so that the cursor can move back. Call before replay.
  void enable_rewind() { rewind_ = true; }
  struct Cursor {
    uint64_t raw_position = 0;  // trace events (serial output included) taken from the reader
    bool has_lookahead = false;  // the last of them is the peeked event
    StreamMatch::Literal output;  // the serial-output comparison
    uint64_t events = 0;
    uint64_t last_now = 0;
    std::deque<std::string> recent;
    // Derived time: device reads so far; the last asynchronous event's time, instruction count and device reads;
    // the last time and TSC read.
    uint64_t device_reads = 0, anchor_ns = 0, anchor_instructions = 0, anchor_device_reads = 0, last_ns = 0,
             last_tsc = 0;
  };
  // The cursor can only be saved at a clean point: not inside an asynchronous event, not diverged.
  // Fails while the serial-output comparison holds hashed bytes (megabytes apart): no checkpoint there.
  // Record: the cursor a replay of this trace would have here (the serial output written so far first), so that a
  // checkpoint taken while recording starts a replay (segments/).
  Result<Cursor> save_cursor();
  // Moves the replay to `cursor`. With enable_rewind(), anywhere: reads ahead in the trace if the cursor lies beyond
  // what was read, failing when the trace ends before it. Without, only forward from a reader that has read nothing
  // (a replay that starts at a checkpoint: the reader goes to the cursor's chunk through the index).
  Result<> restore_cursor(const Cursor& cursor);
  // The first raw trace event (serial output included) a replay that starts here reads: record, every event written
  // so far; replay, those taken from the trace less the one peeked at.
  uint64_t next_raw_event() const;
  // Raw trace events held for rewinding (serial output included).
  uint64_t history_size() const { return history_.size(); }
  // The last events taken ("#N description"), oldest first.
  const std::deque<std::string>& recent_events() const { return recent_; }

 private:
  void append(trace::Event event);
  void flush_output();
  void match_output();
  // Replay: takes the next non-output event if it has kind `kind`, else reports divergence.
  const trace::Event* expect(trace::Event::KindCase kind, const std::string& what);
  void diverge(const std::string& what, const std::string& expected, const std::string& actual);
  void remember(const trace::Event& e);
  // Derived time: an asynchronous event's time, from which it goes on; the picoseconds since the last such event;
  // a port, MMIO or device-MSR read.
  void anchor_time(uint64_t now_ns);
  unsigned __int128 derived_ps_since_anchor() const;
  uint64_t derived_now_ns();
  void count_device_read() {
    if (derived_) ++derived_->device_reads;
  }

  Mode mode_;
  ProgressMode progress_;
  uint32_t vcpu_ = 0;
  HostClock host_clock_;
  uint64_t idle_lag_ns_ = 0;  // host time that idle waits no longer count (idle_now_ns)
  uint64_t last_now_ = 0;
  std::optional<uint64_t> frozen_now_;
  std::function<Position()> where_;
  struct DerivedTime {
    TimeRates rates;
    std::function<std::optional<uint64_t>()> instructions;
    uint64_t device_reads = 0, anchor_ns = 0, anchor_instructions = 0, anchor_device_reads = 0, last_ns = 0,
             last_tsc = 0;
  };
  std::optional<DerivedTime> derived_;
  std::optional<SimulatedHost> simulated_;
  FaultPlan faults_;
  uint64_t faults_injected_ = 0;
  std::vector<FaultDrawn> faults_drawn_;  // the first kFaultsKept of each kind
  uint64_t faults_drawn_count_ = 0, net_faults_drawn_count_ = 0;
  // Whether the fault drawn next of its kind (counted) is suppressed; kept for --minimize.
  bool draw_fault(bool network, std::string what);
  // A frame on a simulated wire (engine_faults.cpp): its latency and the fault it suffers, drawn from the seed.
  struct NetworkFate {
    enum class Fault { kNone, kDrop, kDuplicate, kReorder } fault = Fault::kNone;
    uint64_t latency_ns = 0;
  };
  NetworkFate network_fate(unsigned nic, NetworkLink::Way way, uint64_t ordinal, std::span<const uint8_t> frame);
  void send_on_link(unsigned nic, NetworkLink::Way way, std::vector<uint8_t> frame);
  static constexpr size_t kFaultsKept = 4096;
  SplitMix64 simulated_random_{0};
  uint64_t host_random(bool* ok);  // host_random64(), or the simulated host's generator

  std::unique_ptr<TraceWriter> writer_;
  std::vector<uint8_t> pending_output_;  // record: not yet logged
  std::string write_error_;
  std::string host_error_;
  std::vector<std::unique_ptr<UserNetwork>> networks_;
  std::vector<NetworkLink> links_;  // a simulated host's, by NIC
  uint64_t network_now_ns_ = 0;
  std::vector<std::string> disk_names_;

  std::unique_ptr<TraceReader> reader_;
  std::optional<trace::Event> lookahead_;
  trace::Event current_;
  StreamMatch output_;  // replay: recorded against produced serial output, in bounded memory
  std::string trace_error_;
  uint64_t events_ = 0;
  bool exhausted_ = false;
  std::optional<Divergence> divergence_;
  std::deque<std::string> recent_;  // the last events, for divergence reports

  bool rewind_ = false;
  std::vector<trace::Event> history_;  // with rewind_: every raw event read so far
  uint64_t history_pos_ = 0;           // next raw event to take from history_ (== size: from the reader)
  // Next raw event from the history or the reader; nullopt at the end (exhausted_, trace_error_ set).
  std::optional<trace::Event> next_raw();
};

trace::Coordinate to_proto(const Position& p);
// Whether the guest is at `recorded`: every field of the coordinate, the guest-exit count included.
bool same_coordinate(const trace::Coordinate& recorded, const Position& p, ProgressMode progress);
// A recorded instruction count (0 = not counted) that the replay counted differently.
bool instructions_differ(uint64_t recorded, const Position& p);

}  // namespace deja
