// The trace header's mapping to and from a machine configuration, both directions side by side (rr's TraceStream).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "boot/linux_boot.h"
#include "boot/loader.h"
#include "core/cpu_model.h"
#include "core/error.h"
#include "logging/trace.pb.h"
#include "replay/engine.h"
#include "replay/scheduler.h"
#include "vmm/disk_image.h"
#include "vmm/machine.h"

namespace deja {

class Session;

// One of the guest's input files as recorded: what replay reads again and checks.
struct RecordedInput {
  std::string role;    // "image", "kernel" (a Linux kernel), "initrd", "module", "serial-in", "tftp" (a directory)
  std::string path;    // as given when recorded
  std::string sha256;  // 32 bytes
  uint64_t size = 0;
  bool operator==(const RecordedInput&) const = default;
};

// An input file's record: its role, its path and what was read from it.
RecordedInput recorded_input(const std::string& role, const std::string& path, std::span<const uint8_t> bytes);

// A virtio-blk disk as recorded: its image's path and identity, and how the guest saw it.
struct RecordedDisk {
  std::string path;
  DiskIdentity identity;  // size, and SHA-256 (full mode) or the block size of the per-block hashes (lazy mode)
  bool read_only = false;
  std::string overlay;  // where the recording kept the guest's writes ("": memory); replay never writes it
  std::string serial;   // what VIRTIO_BLK_T_GET_ID answers
  bool operator==(const RecordedDisk& o) const {
    return path == o.path && identity.size == o.identity.size && identity.sha256 == o.identity.sha256 &&
           identity.hash_block == o.identity.hash_block && read_only == o.read_only && overlay == o.overlay &&
           serial == o.serial;
  }
};

// A virtio-net NIC on the user-mode network as recorded.
struct RecordedNic {
  std::vector<std::string> host_forwards;  // hostfwd= rules as given
  std::string mac;                         // 6 bytes
  bool operator==(const RecordedNic&) const = default;
};

// The libvirt domain a recording's machine was described by (`record --libvirt-xml/--libvirt-domain`): provenance.
struct RecordedDomain {
  std::string name, uuid;
  std::string xml_sha256;  // 32 bytes, of the XML as read
  std::string source;      // "file PATH" or "libvirt URI, domain NAME"
  bool schema_validated = false;
  bool operator==(const RecordedDomain&) const = default;
};

// Everything a trace header says, as values: by what and when it was recorded, the machine, the guest's inputs,
// and the ways of the recording session that its replay must take again. Traces written before a field existed
// read back as what they were recorded with (the defaults below).
struct TraceConfig {
  // Provenance.
  uint32_t format_version = 0;
  std::string build_id, deja_version, host;
  int64_t start_unix_ns = 0;  // wall-clock time at machine start: the RTC's epoch
  std::optional<RecordedDomain> libvirt_domain;
  // The machine.
  const CpuModel* cpu_model = &CpuModel::x86_64_v1();
  uint32_t device_model_version = kDeviceModelVersion;
  std::string backend;                             // "kvm" or "interp": the recording's
  std::string machine = std::string(kMachinePc);  // "" in traces before the field: pc
  uint32_t vcpus = 1;
  std::optional<ScheduleConfig> schedule;  // several vCPUs: how they took turns
  std::optional<FaultPlan> faults;         // deja explore's injected faults
  std::optional<StoreBufferPlan> tso;      // x86-TSO store buffers (--tso)
  uint64_t memory_bytes = 0;
  std::string cmdline;
  std::string device_semantics;  // tests only
  std::vector<RecordedDisk> disks;
  std::vector<RecordedNic> nics;
  bool rng = false;
  // The guest's inputs.
  std::vector<RecordedInput> inputs;
  std::vector<std::string> module_args;  // of the "module" inputs, in order
  bool serial_input = false;             // serial input was attached (its bytes are in the trace)
  std::optional<LinuxEntry> boot_protocol;  // a Linux kernel: the --boot-protocol asked for
  std::string image_format;                 // a Linux kernel: the entry the loader took ("linux-pvh", ...)
  // How it was recorded.
  ProgressMode progress = ProgressMode::kExact;
  std::string progress_counter;  // exact mode: what counted ("interp", "emulated-pmu:N", "pmu ...")
  bool rdtsc_trapped = false;
  bool rdtsc_exits_are_guest_exits = false;
  bool mmio_write_exits_complete = false;
  uint32_t interrupt_window_steps = 0;  // Session::step_to_interrupt_windows
  bool window_steps_trap_flag = false;  // Session::step_windows_by_trap_flag
  uint64_t tsc_hz = CpuModel::kTscHz;
  uint64_t digest_interval = 16384;                                  // unset in a trace: 16384
  uint32_t software_tlb_entries = kSoftwareTlbEntriesBeforeRecorded;  // unset: 256
  std::vector<std::string> cpu_quirks;
  std::optional<Engine::TimeRates> derived_time;

  bool operator==(const TraceConfig& o) const;
};

// Record: the header that says all of `config`.
trace::Header to_header(const TraceConfig& config);
// Replay: what `header` says, checked (a CPU or device model, a progress mode, a boot protocol or a disk this deja
// cannot take is an error, kUnsupported or kBadTrace, naming the field).
Result<TraceConfig> from_header(const trace::Header& header);

// Record: what the header of a recording of `machine`, loaded with `load`, by `session` (built and set up) says
// of its machine, its session's ways and its provenance. The caller adds the inputs, disks, NICs and start time.
TraceConfig recording_config(Session& session, const MachineConfig& machine, const LoadOptions& load,
                             ProgressMode progress);

// Replay: the machine the trace describes, on `backend` (without its disks, which replay opens and checks).
MachineConfig replay_machine(const TraceConfig& config, const std::string& backend);
// Replay: how to load the guest (paths as recorded; the inputs' roles and hashes stay in config.inputs).
LoadOptions replay_load(const TraceConfig& config);
// Replay: `session` (built) takes the recording's ways: which exits are guest exits, the digest interval, MMIO
// writes' completion, the software TLB's size, derived time, the CPU's quirks (a quirk this backend cannot
// reproduce is only a warning: a guest that sees the difference diverges, which replay reports).
Result<> adopt_recording_ways(Session& session, const TraceConfig& config);

}  // namespace deja
