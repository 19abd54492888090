// The trace header from a recording's configuration and back: every header field is written and read here.
#include "replay/trace_config.h"

#include <fmt/format.h>

#include "core/build_info.h"
#include "core/messages.h"
#include "logging/trace_format.h"
#include "replay/session.h"
#include "vmm/host_io.h"

namespace deja {

RecordedInput recorded_input(const std::string& role, const std::string& path, std::span<const uint8_t> bytes) {
  auto sha = sha256_bytes(bytes);
  return RecordedInput{role, path, std::string(sha.begin(), sha.end()), bytes.size()};
}

bool TraceConfig::operator==(const TraceConfig& o) const {
  auto same_rates = [](const std::optional<Engine::TimeRates>& a, const std::optional<Engine::TimeRates>& b) {
    return a.has_value() == b.has_value() &&
           (!a || (a->ps_per_instruction == b->ps_per_instruction && a->ns_per_device_read == b->ns_per_device_read));
  };
  return format_version == o.format_version && build_id == o.build_id && deja_version == o.deja_version &&
         host == o.host && start_unix_ns == o.start_unix_ns && libvirt_domain == o.libvirt_domain &&
         cpu_model == o.cpu_model &&
         device_model_version == o.device_model_version && backend == o.backend && machine == o.machine &&
         vcpus == o.vcpus && schedule == o.schedule && faults == o.faults && tso == o.tso && memory_bytes == o.memory_bytes && cmdline == o.cmdline &&
         device_semantics == o.device_semantics && disks == o.disks && nics == o.nics && rng == o.rng &&
         inputs == o.inputs && module_args == o.module_args && serial_input == o.serial_input &&
         boot_protocol == o.boot_protocol && image_format == o.image_format && progress == o.progress &&
         progress_counter == o.progress_counter && rdtsc_trapped == o.rdtsc_trapped &&
         rdtsc_exits_are_guest_exits == o.rdtsc_exits_are_guest_exits &&
         mmio_write_exits_complete == o.mmio_write_exits_complete &&
         interrupt_window_steps == o.interrupt_window_steps &&
         window_steps_trap_flag == o.window_steps_trap_flag && tsc_hz == o.tsc_hz &&
         digest_interval == o.digest_interval && software_tlb_entries == o.software_tlb_entries &&
         cpu_quirks == o.cpu_quirks && same_rates(derived_time, o.derived_time);
}

trace::Header to_header(const TraceConfig& t) {
  trace::Header h;
  h.set_format_version(t.format_version);
  h.set_build_id(t.build_id);
  h.set_deja_version(t.deja_version);
  h.set_host(t.host);
  h.set_start_unix_ns(t.start_unix_ns);
  if (const auto& d = t.libvirt_domain) {
    auto* domain = h.mutable_libvirt_domain();
    domain->set_name(d->name);
    domain->set_uuid(d->uuid);
    domain->set_xml_sha256(d->xml_sha256);
    domain->set_source(d->source);
    domain->set_schema_validated(d->schema_validated);
  }
  h.set_cpu_model(std::string(t.cpu_model->name()));
  h.set_cpu_model_version(t.cpu_model->version());
  h.set_device_model_version(t.device_model_version);
  for (const RecordedInput& in : t.inputs) {
    auto* f = h.add_inputs();
    f->set_role(in.role);
    f->set_path(in.path);
    f->set_sha256(in.sha256);
    f->set_size(in.size);
  }
  auto* c = h.mutable_config();
  c->set_backend(t.backend);
  c->set_machine(t.machine);
  c->set_vcpus(t.vcpus);
  if (t.schedule) {
    auto* sc = c->mutable_schedule();
    sc->set_policy(t.schedule->policy);
    sc->set_seed(t.schedule->seed);
    sc->set_unit(std::string(slice_unit_name(t.schedule->unit)));
    sc->set_quantum(t.schedule->quantum);
    sc->set_pause_limit(t.schedule->pause_limit);
    sc->set_depth(t.schedule->depth);
    sc->set_change_window(t.schedule->change_window);
    sc->set_dropped_change_points(t.schedule->dropped_change_points);
    sc->set_version(t.schedule->version);
    sc->set_lock_events(t.schedule->lock_events);
  }
  if (t.faults) {
    auto* f = c->mutable_faults();
    f->set_seed(t.faults->seed);
    f->set_disk_eio_ppm(t.faults->disk_eio_ppm);
    f->set_disk_torn_ppm(t.faults->disk_torn_ppm);
    for (uint64_t n : t.faults->suppressed) f->add_suppressed(n);
    f->set_net_drop_ppm(t.faults->net_drop_ppm);
    f->set_net_dup_ppm(t.faults->net_dup_ppm);
    f->set_net_reorder_ppm(t.faults->net_reorder_ppm);
    for (uint64_t n : t.faults->net_suppressed) f->add_net_suppressed(n);
  }
  if (t.tso) {
    auto* b = c->mutable_tso();
    b->set_seed(t.tso->seed);
    b->set_capacity(t.tso->capacity);
    b->set_drain_mean(t.tso->drain_mean);
  }
  c->set_memory_bytes(t.memory_bytes);
  c->set_cmdline(t.cmdline);
  c->set_device_semantics(t.device_semantics);
  for (const RecordedDisk& d : t.disks) {
    auto* disk = c->add_disks();
    disk->set_path(d.path);
    disk->set_size(d.identity.size);
    if (d.identity.hash_block) {
      disk->set_hash_block(d.identity.hash_block);
    } else {
      disk->set_sha256(d.identity.sha256.data(), d.identity.sha256.size());
    }
    disk->set_read_only(d.read_only);
    disk->set_overlay(d.overlay);
    disk->set_serial(d.serial);
  }
  for (const RecordedNic& n : t.nics) {
    auto* nic = c->add_nets();
    nic->set_mode("user");
    for (const auto& f : n.host_forwards) nic->add_host_forwards(f);
    nic->set_mac(n.mac);
  }
  c->set_rng(t.rng);
  for (const auto& a : t.module_args) c->add_module_args(a);
  c->set_serial_input(t.serial_input);
  if (t.boot_protocol) c->set_boot_protocol(std::string(linux_entry_name(*t.boot_protocol)));
  c->set_image_format(t.image_format);
  c->set_progress_mode(std::string(progress_mode_name(t.progress)));
  c->set_progress_counter(t.progress_counter);
  c->set_rdtsc_trapped(t.rdtsc_trapped);
  c->set_rdtsc_exits_are_guest_exits(t.rdtsc_exits_are_guest_exits);
  c->set_mmio_write_exits_complete(t.mmio_write_exits_complete);
  c->set_interrupt_window_steps(t.interrupt_window_steps);
  c->set_window_steps_trap_flag(t.window_steps_trap_flag);
  c->set_tsc_hz(t.tsc_hz);
  c->set_digest_interval(t.digest_interval);
  c->set_software_tlb_entries(t.software_tlb_entries);
  for (const auto& q : t.cpu_quirks) c->add_cpu_quirks(q);
  if (t.derived_time) {
    c->mutable_derived_time()->set_picoseconds_per_instruction(t.derived_time->ps_per_instruction);
    c->mutable_derived_time()->set_nanoseconds_per_device_read(t.derived_time->ns_per_device_read);
  }
  return h;
}

Result<TraceConfig> from_header(const trace::Header& h) {
  const auto& c = h.config();
  TraceConfig t;
  t.format_version = h.format_version();
  t.build_id = h.build_id();
  t.deja_version = h.deja_version();
  t.host = h.host();
  t.start_unix_ns = h.start_unix_ns();
  if (h.has_libvirt_domain()) {
    const auto& d = h.libvirt_domain();
    t.libvirt_domain = RecordedDomain{d.name(), d.uuid(), d.xml_sha256(), d.source(), d.schema_validated()};
  }
  t.cpu_model = CpuModel::for_trace(h.cpu_model(), h.cpu_model_version());
  if (!t.cpu_model) {
    return fail(ErrorKind::kUnsupported, "recorded with CPU model {} v{}; this deja implements {}",
                h.cpu_model().empty() ? "(unnamed)" : h.cpu_model(), h.cpu_model_version(), CpuModel::names());
  }
  t.device_model_version = h.device_model_version();
  if (t.device_model_version < kOldestDeviceModelVersion || t.device_model_version > kDeviceModelVersion) {
    return fail(ErrorKind::kUnsupported, "recorded with device model v{}; this deja implements v{} to v{}",
                t.device_model_version, kOldestDeviceModelVersion, kDeviceModelVersion);
  }
  for (const auto& f : h.inputs()) t.inputs.push_back(RecordedInput{f.role(), f.path(), f.sha256(), f.size()});
  t.backend = c.backend();
  t.machine = c.machine().empty() ? std::string(kMachinePc) : c.machine();
  t.vcpus = c.vcpus() ? c.vcpus() : 1;
  if (t.vcpus > kMaxVcpus) return fail(ErrorKind::kBadTrace, "it has {} vCPUs; a machine has at most {}", t.vcpus, kMaxVcpus);
  if (c.has_schedule()) {
    const auto& sc = c.schedule();
    ScheduleConfig schedule;
    schedule.policy = sc.policy();
    schedule.seed = sc.seed();
    if (sc.unit() == slice_unit_name(SliceUnit::kInstructions)) {
      schedule.unit = SliceUnit::kInstructions;
    } else if (sc.unit() == slice_unit_name(SliceUnit::kGuestExits)) {
      schedule.unit = SliceUnit::kGuestExits;
    } else {
      return fail(ErrorKind::kBadTrace, "its schedule counts slices in '{}'", sc.unit());
    }
    schedule.quantum = sc.quantum();
    schedule.pause_limit = sc.pause_limit();
    schedule.depth = sc.depth();
    schedule.change_window = sc.change_window();
    schedule.dropped_change_points = sc.dropped_change_points();
    schedule.version = sc.version();
    schedule.lock_events = sc.lock_events();
    if (auto usable = make_scheduler(schedule); !usable) return fail(ErrorKind::kBadTrace, "{}", usable.error().message);
    t.schedule = schedule;
  }
  if (c.has_faults()) {
    const auto& f = c.faults();
    if (uint64_t(f.disk_eio_ppm()) + f.disk_torn_ppm() > 1'000'000 ||
        uint64_t(f.net_drop_ppm()) + f.net_dup_ppm() + f.net_reorder_ppm() > 1'000'000) {
      return fail(ErrorKind::kBadTrace, "its fault rates are above one in one");
    }
    if (f.suppressed_size() > 1'000'000 || f.net_suppressed_size() > 1'000'000) {
      return fail(ErrorKind::kBadTrace, "it suppresses too many faults");
    }
    FaultPlan plan{f.seed(), f.disk_eio_ppm(), f.disk_torn_ppm(),
                   std::vector<uint64_t>(f.suppressed().begin(), f.suppressed().end())};
    plan.net_drop_ppm = f.net_drop_ppm();
    plan.net_dup_ppm = f.net_dup_ppm();
    plan.net_reorder_ppm = f.net_reorder_ppm();
    plan.net_suppressed.assign(f.net_suppressed().begin(), f.net_suppressed().end());
    t.faults = plan;
  }
  if (c.has_tso()) {
    const auto& b = c.tso();
    if (b.capacity() < 1 || b.capacity() > 4096 || b.drain_mean() < 1 || b.drain_mean() > (1u << 30)) {
      return fail(ErrorKind::kBadTrace, "its store buffers hold {} stores and drain after {} instructions on average "
                  "(1 to 4096 stores, 1 to 2^30 instructions)", b.capacity(), b.drain_mean());
    }
    t.tso = StoreBufferPlan{b.seed(), b.capacity(), b.drain_mean()};
  }
  if ((t.vcpus > 1) != t.schedule.has_value()) {
    return fail(ErrorKind::kBadTrace, "it has {} vCPUs and {} schedule", t.vcpus, t.schedule ? "a" : "no");
  }
  t.memory_bytes = c.memory_bytes();
  t.cmdline = c.cmdline();
  t.device_semantics = c.device_semantics();
  for (int i = 0; i < c.disks_size(); ++i) {
    const auto& d = c.disks(i);
    RecordedDisk disk{d.path(), DiskIdentity{}, d.read_only(), d.overlay(), d.serial()};
    disk.identity.size = d.size();
    disk.identity.hash_block = d.hash_block();
    if (disk.identity.hash_block == 0) {
      if (d.sha256().size() != disk.identity.sha256.size()) {
        return fail(ErrorKind::kBadTrace, "disk {} has neither a SHA-256 nor a block size", i);
      }
      std::copy(d.sha256().begin(), d.sha256().end(), disk.identity.sha256.begin());
    } else if (disk.identity.hash_block != DiskImage::kHashBlock) {
      return fail(ErrorKind::kBadTrace, "disk {} was hashed in blocks of {} bytes; this deja hashes {}", i,
                  disk.identity.hash_block, DiskImage::kHashBlock);
    }
    t.disks.push_back(std::move(disk));
  }
  for (const auto& n : c.nets()) {
    t.nics.push_back(RecordedNic{std::vector<std::string>(n.host_forwards().begin(), n.host_forwards().end()), n.mac()});
  }
  t.rng = c.rng();
  t.module_args.assign(c.module_args().begin(), c.module_args().end());
  t.serial_input = c.serial_input();
  if (!c.boot_protocol().empty()) {
    auto entry = parse_linux_entry(c.boot_protocol());
    if (!entry) return fail(ErrorKind::kBadTrace, "{}", entry.error().message);
    t.boot_protocol = *entry;
  }
  t.image_format = c.image_format();
  if (c.progress_mode() == "exact") {
    t.progress = ProgressMode::kExact;
  } else if (c.progress_mode() == "exit-sync") {
    t.progress = ProgressMode::kExitSync;
  } else {
    return fail(ErrorKind::kUnsupported, "uses progress mode '{}', which this deja cannot replay", c.progress_mode());
  }
  t.progress_counter = c.progress_counter();
  t.rdtsc_trapped = c.rdtsc_trapped();
  t.rdtsc_exits_are_guest_exits = c.rdtsc_exits_are_guest_exits();
  t.mmio_write_exits_complete = c.mmio_write_exits_complete();
  t.interrupt_window_steps = c.interrupt_window_steps();
  t.window_steps_trap_flag = c.window_steps_trap_flag();
  t.tsc_hz = c.tsc_hz();
  t.digest_interval = c.digest_interval() ? c.digest_interval() : Session::kDefaultDigestInterval;
  t.software_tlb_entries = c.software_tlb_entries() ? c.software_tlb_entries() : kSoftwareTlbEntriesBeforeRecorded;
  t.cpu_quirks.assign(c.cpu_quirks().begin(), c.cpu_quirks().end());
  if (c.has_derived_time()) {
    if (c.derived_time().picoseconds_per_instruction() == 0) return fail(ErrorKind::kBadTrace, "its derived time has no rate");
    t.derived_time = Engine::TimeRates{c.derived_time().picoseconds_per_instruction(),
                                       c.derived_time().nanoseconds_per_device_read()};
  }
  return t;
}

TraceConfig recording_config(Session& session, const MachineConfig& machine, const LoadOptions& load,
                             ProgressMode progress) {
  const Backend& cpu = session.machine().backend();
  TraceConfig t;
  t.format_version = kTraceFormatVersion;
  t.build_id = build_id();
  t.deja_version = deja_version();
  t.host = host_description();
  t.cpu_model = machine.cpu_model;
  t.device_model_version = kDeviceModelVersion;
  t.backend = machine.backend;
  t.machine = machine.machine;
  t.vcpus = machine.vcpus;
  t.tso = machine.tso;
  if (const Scheduler* scheduler = session.scheduler()) t.schedule = scheduler->config();
  if (session.engine().fault_plan().any()) t.faults = session.engine().fault_plan();
  t.memory_bytes = machine.memory_bytes;
  t.cmdline = machine.cmdline;
  t.device_semantics = machine.device_semantics;
  t.rng = machine.rng;
  for (const auto& m : load.modules) t.module_args.push_back(m.args);
  if (load.linux_kernel) {
    t.boot_protocol = load.linux_entry;
    t.image_format = session.image_format();
  }
  t.progress = progress;
  if (progress == ProgressMode::kExact) t.progress_counter = session.counter_description();
  t.rdtsc_trapped = cpu.traps_rdtsc();
  t.rdtsc_exits_are_guest_exits = session.rdtsc_exits_are_guest_exits();
  t.mmio_write_exits_complete = session.mmio_write_exits_complete();
  t.interrupt_window_steps = session.interrupt_window_steps();
  t.window_steps_trap_flag = session.window_steps_by_trap_flag();
  t.digest_interval = session.digest_interval();
  t.software_tlb_entries = kSoftwareTlbEntries;
  t.cpu_quirks = cpu.cpu_quirks();
  t.derived_time = session.engine().derived_time_rates();
  return t;
}

MachineConfig replay_machine(const TraceConfig& t, const std::string& backend) {
  MachineConfig m;
  m.memory_bytes = t.memory_bytes;
  m.cmdline = t.cmdline;
  m.backend = backend;
  m.machine = t.machine;
  m.vcpus = t.vcpus;
  m.tso = t.tso;
  m.cpu_model = t.cpu_model;
  m.device_model_version = t.device_model_version;
  m.rtc_epoch_unix_seconds = t.start_unix_ns / 1'000'000'000;
  m.device_semantics = t.device_semantics;
  m.trap_rdtsc = t.rdtsc_trapped;
  m.nics = unsigned(t.nics.size());
  for (const RecordedNic& n : t.nics) {
    std::array<uint8_t, 6> mac = nic_mac(unsigned(m.nic_macs.size()));  // every trace so far holds 6 bytes
    if (n.mac.size() == mac.size()) std::copy(n.mac.begin(), n.mac.end(), mac.begin());
    m.nic_macs.push_back(mac);
  }
  m.rng = t.rng;
  return m;
}

LoadOptions replay_load(const TraceConfig& t) {
  LoadOptions load;
  load.cmdline = t.cmdline;
  if (t.boot_protocol) {
    load.linux_kernel = true;
    load.linux_entry = *t.boot_protocol;
  }
  size_t module = 0;
  for (const RecordedInput& in : t.inputs) {
    if (in.role == "initrd" && load.initrd_path.empty()) load.initrd_path = in.path;
    if (in.role != "module") continue;
    load.modules.push_back({in.path, module < t.module_args.size() ? t.module_args[module] : std::string()});
    ++module;
  }
  return load;
}

Result<> adopt_recording_ways(Session& session, const TraceConfig& t) {
  if (t.faults) session.set_fault_plan(*t.faults);
  if (t.schedule) {
    if (auto ok = session.set_schedule(*t.schedule); !ok) return ok;
  }
  if (t.derived_time) {
    if (auto ok = session.derive_time(*t.derived_time); !ok) {
      return fail(ErrorKind::kUnsupported, "recorded on {} with time derived from the instruction count: {}; replay "
                  "with --backend interp", t.backend, ok.error().message);
    }
  }
  session.count_rdtsc_as_guest_exits(t.rdtsc_exits_are_guest_exits);
  session.set_digest_interval(t.digest_interval);
  session.complete_mmio_write_exits(t.mmio_write_exits_complete);
  session.step_to_interrupt_windows(t.interrupt_window_steps);
  session.step_windows_by_trap_flag(t.window_steps_trap_flag);
  for (size_t i = 0; i < session.machine().vcpu_count(); ++i) {
    Backend& cpu = session.machine().backend(i);
    if (auto ok = cpu.adopt_software_tlb_entries(t.software_tlb_entries); !ok) return ok;
    if (auto ok = cpu.adopt_cpu_quirks(t.cpu_quirks); !ok) {
      // Not a refusal: many guests never see the difference, and one that does diverges, which replay reports.
      if (i == 0) {
        say("warning: {}: the replay diverges where the guest sees the difference ({})", ok.error().message,
            t.cpu_quirks.empty() ? "record it on interp or on this host"
                                 : "--backend interp reproduces the recorded CPU");
      }
    }
  }
  return {};
}

}  // namespace deja
