// Unit tests of the trace header's mapping (replay/trace_config.h): every field survives config -> header -> config,
// and a header of an older trace reads back as what it was recorded with.
#include <gtest/gtest.h>

#include "replay/trace_config.h"

namespace deja {
namespace {

// Every field set to something other than its default.
TraceConfig everything() {
  TraceConfig t;
  t.format_version = 5;
  t.build_id = "build-1234";
  t.deja_version = "0.9.1";
  t.host = "Linux 6.1 x86_64, AMD EPYC";
  t.start_unix_ns = 1'700'000'000'123'456'789;
  t.cpu_model = CpuModel::all().back();
  t.device_model_version = kOldestDeviceModelVersion + 1;
  t.backend = "kvm";
  t.machine = std::string(kMachinePcApic);
  t.vcpus = 2;
  t.schedule = ScheduleConfig{"pct", 0x1234'5678'9abc'def0ull, SliceUnit::kGuestExits, 48, 9, 3, 500, 2,
                              kScheduleVersionPauseWithCompany};
  t.faults = FaultPlan{77, 20'000, 5'000, {3, 9}};
  t.tso = StoreBufferPlan{88, 40, 32};
  t.memory_bytes = 512ull << 20;
  t.cmdline = "console=ttyS0 café";
  t.device_semantics = "test:uart-lsr-temt";
  RecordedDisk full{"disk.img", DiskIdentity{}, true, "disk.overlay", "deja-disk0"};
  full.identity.size = 1 << 20;
  full.identity.sha256.fill(0xab);
  RecordedDisk lazy{"big.img", DiskIdentity{}, false, "", "deja-disk1"};
  lazy.identity.size = 8ull << 30;
  lazy.identity.hash_block = DiskImage::kHashBlock;
  t.disks = {full, lazy};
  t.nics = {RecordedNic{{"tcp::8080-:80", "tcp:127.0.0.1:2222-:22"}, std::string("\x52\x54\x00\x12\x34\x56", 6)},
            RecordedNic{{}, std::string("\x52\x54\x00\x12\x34\x57", 6)}};
  t.rng = true;
  t.libvirt_domain = RecordedDomain{"web1", "c7a5fdbd-cdaf-9455-926a-d65c16db1809", std::string(32, '\x04'),
                                    "file web1.xml", true};
  t.inputs = {RecordedInput{"kernel", "/boot/vmlinuz", std::string(32, '\x01'), 7'000'000},
              RecordedInput{"initrd", "initrd.img", std::string(32, '\x02'), 3'000'000},
              RecordedInput{"serial-in", "input.txt", std::string(32, '\x03'), 42}};
  t.module_args = {"one", ""};
  t.serial_input = true;
  t.boot_protocol = LinuxEntry::kPvh;
  t.image_format = "linux-pvh";
  t.progress = ProgressMode::kExitSync;
  t.progress_counter = "pmu amd raw 0xc4";
  t.rdtsc_trapped = true;
  t.rdtsc_exits_are_guest_exits = true;
  t.mmio_write_exits_complete = true;
  t.interrupt_window_steps = 16384;
  t.window_steps_trap_flag = true;
  t.tsc_hz = 3'000'000'000;
  t.digest_interval = 77;
  t.software_tlb_entries = 1024;
  t.cpu_quirks = {std::string(kCpuQuirkFxsaveNoX87Pointers), std::string(kCpuQuirkAccessedBitOnlyBySegmentLoads)};
  t.derived_time = Engine::TimeRates{1500, 700};
  return t;
}

TEST(TraceConfig, EveryFieldRoundTrips) {
  const TraceConfig t = everything();
  auto back = from_header(to_header(t));
  ASSERT_TRUE(back.has_value()) << back.error().message;
  EXPECT_TRUE(*back == t);
  // Field by field, so that a failure names the field (operator== is what the test above trusts).
  EXPECT_EQ(back->start_unix_ns, t.start_unix_ns);
  EXPECT_EQ(back->cpu_model, t.cpu_model);
  EXPECT_EQ(back->machine, t.machine);
  EXPECT_EQ(back->disks, t.disks);
  EXPECT_EQ(back->nics, t.nics);
  EXPECT_EQ(back->libvirt_domain, t.libvirt_domain);
  EXPECT_EQ(back->inputs, t.inputs);
  EXPECT_EQ(back->boot_protocol, t.boot_protocol);
  EXPECT_EQ(back->progress, t.progress);
  EXPECT_EQ(back->cpu_quirks, t.cpu_quirks);
  ASSERT_TRUE(back->derived_time.has_value());
  EXPECT_EQ(back->derived_time->ps_per_instruction, 1500u);
  EXPECT_EQ(back->derived_time->ns_per_device_read, 700u);
  // And the header itself: config -> header -> config -> header gives the same bytes.
  EXPECT_EQ(to_header(*back).SerializeAsString(), to_header(t).SerializeAsString());
}

TEST(TraceConfig, EachFieldMatters) {
  // operator== sees a change to any one field (so the round trip above covers each of them).
  const TraceConfig base = everything();
  std::vector<std::function<void(TraceConfig&)>> changes = {
      [](TraceConfig& t) { t.format_version++; }, [](TraceConfig& t) { t.build_id += "x"; },
      [](TraceConfig& t) { t.deja_version += "x"; }, [](TraceConfig& t) { t.host += "x"; },
      [](TraceConfig& t) { t.start_unix_ns++; }, [](TraceConfig& t) { t.cpu_model = &CpuModel::x86_64_v1(); },
      [](TraceConfig& t) { t.device_model_version++; }, [](TraceConfig& t) { t.backend = "interp"; },
      [](TraceConfig& t) { t.machine = "pc"; }, [](TraceConfig& t) { t.vcpus++; },
      [](TraceConfig& t) { t.memory_bytes++; }, [](TraceConfig& t) { t.cmdline += "x"; },
      [](TraceConfig& t) { t.device_semantics.clear(); }, [](TraceConfig& t) { t.disks[0].read_only = false; },
      [](TraceConfig& t) { t.disks[1].identity.hash_block = 0; }, [](TraceConfig& t) { t.disks[0].overlay.clear(); },
      [](TraceConfig& t) { t.disks[0].serial += "x"; }, [](TraceConfig& t) { t.disks[0].identity.sha256[3] = 0; },
      [](TraceConfig& t) { t.nics[0].host_forwards.pop_back(); }, [](TraceConfig& t) { t.nics[1].mac[5] = 0; },
      [](TraceConfig& t) { t.rng = false; }, [](TraceConfig& t) { t.inputs[1].path += "x"; },
      [](TraceConfig& t) { t.libvirt_domain->uuid.clear(); }, [](TraceConfig& t) { t.libvirt_domain.reset(); },
      [](TraceConfig& t) { t.inputs[2].size++; }, [](TraceConfig& t) { t.module_args.pop_back(); },
      [](TraceConfig& t) { t.serial_input = false; }, [](TraceConfig& t) { t.boot_protocol.reset(); },
      [](TraceConfig& t) { t.image_format += "x"; }, [](TraceConfig& t) { t.progress = ProgressMode::kExact; },
      [](TraceConfig& t) { t.progress_counter += "x"; }, [](TraceConfig& t) { t.rdtsc_trapped = false; },
      [](TraceConfig& t) { t.rdtsc_exits_are_guest_exits = false; },
      [](TraceConfig& t) { t.mmio_write_exits_complete = false; }, [](TraceConfig& t) { t.tsc_hz++; },
      [](TraceConfig& t) { t.digest_interval++; }, [](TraceConfig& t) { t.software_tlb_entries = 2048; },
      [](TraceConfig& t) { t.cpu_quirks.pop_back(); }, [](TraceConfig& t) { t.derived_time->ns_per_device_read++; },
      [](TraceConfig& t) { t.derived_time.reset(); }, [](TraceConfig& t) { t.schedule->seed++; },
      [](TraceConfig& t) { t.schedule->unit = SliceUnit::kInstructions; }, [](TraceConfig& t) { t.schedule->quantum++; },
      [](TraceConfig& t) { t.schedule->pause_limit++; }, [](TraceConfig& t) { t.schedule->depth++; },
      [](TraceConfig& t) { t.schedule->change_window++; }, [](TraceConfig& t) { t.schedule->dropped_change_points = 0; },
      [](TraceConfig& t) { t.schedule->version = kScheduleVersionPauseAlways; },
      [](TraceConfig& t) { t.schedule->lock_events = !t.schedule->lock_events; },
      [](TraceConfig& t) { t.faults->seed++; }, [](TraceConfig& t) { t.faults->disk_eio_ppm++; },
      [](TraceConfig& t) { t.faults->disk_torn_ppm++; }, [](TraceConfig& t) { t.faults->suppressed.pop_back(); },
      [](TraceConfig& t) { t.faults.reset(); },
      [](TraceConfig& t) { t.tso->seed++; }, [](TraceConfig& t) { t.tso->capacity++; },
      [](TraceConfig& t) { t.tso->drain_mean++; }, [](TraceConfig& t) { t.tso.reset(); },
      [](TraceConfig& t) { t.interrupt_window_steps = 0; }, [](TraceConfig& t) { t.window_steps_trap_flag = false; },
      [](TraceConfig& t) {
        t.vcpus = 1;
        t.schedule.reset();
      },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    TraceConfig t = base;
    changes[i](t);
    EXPECT_FALSE(t == base) << "change " << i;
    auto back = from_header(to_header(t));
    ASSERT_TRUE(back.has_value()) << "change " << i << ": " << back.error().message;
    EXPECT_TRUE(*back == t) << "change " << i;
  }
}

TEST(TraceConfig, OldTracesReadAsRecorded) {
  // A header from before machine, digest_interval, software_tlb_entries and vcpus were written.
  trace::Header h;
  h.set_cpu_model_version(1);  // unnamed: deja-v1, the only model then
  h.set_device_model_version(kOldestDeviceModelVersion);
  h.mutable_config()->set_progress_mode("exact");
  auto t = from_header(h);
  ASSERT_TRUE(t.has_value()) << t.error().message;
  EXPECT_EQ(t->cpu_model, &CpuModel::deja_v1());
  EXPECT_EQ(t->machine, kMachinePc);
  EXPECT_EQ(t->digest_interval, 16384u);
  EXPECT_EQ(t->software_tlb_entries, kSoftwareTlbEntriesBeforeRecorded);
  EXPECT_EQ(t->vcpus, 1u);
  EXPECT_FALSE(t->boot_protocol.has_value());
  EXPECT_FALSE(t->derived_time.has_value());
}

TEST(TraceConfig, RefusesWhatItCannotReplay) {
  const trace::Header good = to_header(everything());
  auto refused = [](trace::Header h, ErrorKind kind, const std::string& words) {
    auto t = from_header(h);
    ASSERT_FALSE(t.has_value()) << words;
    EXPECT_EQ(t.error().kind, kind) << t.error().message;
    EXPECT_NE(t.error().message.find(words), std::string::npos) << t.error().message;
  };
  trace::Header h = good;
  h.set_cpu_model("no-such-cpu");
  refused(h, ErrorKind::kUnsupported, "CPU model no-such-cpu");
  h = good;
  h.set_device_model_version(kDeviceModelVersion + 1);
  refused(h, ErrorKind::kUnsupported, "device model");
  h = good;
  h.mutable_config()->set_progress_mode("sometimes");
  refused(h, ErrorKind::kUnsupported, "progress mode 'sometimes'");
  h = good;
  h.mutable_config()->set_boot_protocol("floppy");
  refused(h, ErrorKind::kBadTrace, "floppy");
  h = good;
  h.mutable_config()->mutable_disks(0)->set_sha256("short");
  refused(h, ErrorKind::kBadTrace, "disk 0");
  h = good;
  h.mutable_config()->mutable_disks(1)->set_hash_block(512);
  refused(h, ErrorKind::kBadTrace, "blocks of 512");
  h = good;
  h.mutable_config()->mutable_derived_time()->set_picoseconds_per_instruction(0);
  refused(h, ErrorKind::kBadTrace, "derived time");
  h = good;
  h.mutable_config()->clear_schedule();
  refused(h, ErrorKind::kBadTrace, "2 vCPUs and no schedule");
  h = good;
  h.mutable_config()->mutable_schedule()->set_unit("fortnights");
  refused(h, ErrorKind::kBadTrace, "fortnights");
  h = good;
  h.mutable_config()->mutable_schedule()->set_policy("lottery");
  refused(h, ErrorKind::kBadTrace, "lottery");
  h = good;
  h.mutable_config()->mutable_schedule()->set_version(kScheduleVersionPauseWithCompany + 1);
  refused(h, ErrorKind::kBadTrace, "schedule version 2 is newer");
  h = good;
  h.mutable_config()->mutable_schedule()->set_depth(0);
  refused(h, ErrorKind::kBadTrace, "PCT depth 0");
  h = good;
  h.mutable_config()->mutable_faults()->set_disk_eio_ppm(2'000'000);
  refused(h, ErrorKind::kBadTrace, "fault rates");
  h = good;
  h.mutable_config()->mutable_tso()->set_capacity(0);
  refused(h, ErrorKind::kBadTrace, "store buffers");
  h = good;
  h.mutable_config()->set_vcpus(kMaxVcpus + 1);
  refused(h, ErrorKind::kBadTrace, "vCPUs");
}

TEST(TraceConfig, ReplayMachineAndLoad) {
  const TraceConfig t = everything();
  MachineConfig m = replay_machine(t, "interp");
  EXPECT_EQ(m.backend, "interp");
  EXPECT_EQ(m.memory_bytes, t.memory_bytes);
  EXPECT_EQ(m.machine, t.machine);
  EXPECT_EQ(m.cpu_model, t.cpu_model);
  EXPECT_EQ(m.rtc_epoch_unix_seconds, 1'700'000'000);
  EXPECT_EQ(m.nics, 2u);
  EXPECT_TRUE(m.rng);
  EXPECT_TRUE(m.trap_rdtsc);
  EXPECT_EQ(m.tso, t.tso);
  LoadOptions load = replay_load(t);
  EXPECT_TRUE(load.linux_kernel);
  EXPECT_EQ(load.linux_entry, LinuxEntry::kPvh);
  EXPECT_EQ(load.initrd_path, "initrd.img");
  EXPECT_EQ(load.cmdline, t.cmdline);
}

}  // namespace
}  // namespace deja
