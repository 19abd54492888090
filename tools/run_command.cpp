// `deja run` and `deja record`: build a machine for a guest image, run it, and (record) write every input to a trace.
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "boot/multiboot.h"
#include "kvm/pmu.h"
#include "logging/output_file.h"
#include "logging/signing.h"
#include "logging/trace_format.h"
#include "logging/trace_signature.h"
#include "replay/trace_config.h"
#include "segments/trace_checkpoints.h"
#include "tools/command_support.h"
#include "tools/run_options.h"
#include "tools/libvirt_options.h"
#include "tools/linux_guest.h"
#include "core/exit_status.h"
#include "vmm/disk_image.h"
#include "vmm/user_network.h"
#include "core/cpu_model.h"
#include "core/guest_memory.h"
#include "vmm/host_io.h"
#include "core/messages.h"

namespace deja {

void add_run_options(CLI::App* cmd, RunArgs& a) {
  cmd->add_option("--backend", a.backend,
                  "vCPU backend: kvm or interp (default: kvm where this host's KVM passes deja's usability check, "
                  "see `deja selftest`; else interp)")
      ->check(CLI::IsMember({"kvm", "interp"}));
  cmd->add_option("--interp-mode", a.interp_mode,
                  "the software CPU's executor: jit (default), threaded, or reference (one instruction at a time, "
                  "the definition the others are tested against)")
      ->check(CLI::IsMember({"reference", "threaded", "jit"}));
  cmd->add_option("--machine", a.machine,
                  "machine type: pc (8259A PIC only, the default) or pc-apic (adds a local APIC, an I/O APIC and an "
                  "MP table; CPUID reports the APIC)")
      ->check(CLI::IsMember({std::string(kMachinePc), std::string(kMachinePcApic)}));
  cmd->add_option("--cpus", a.cpus,
                  fmt::format("vCPUs (1 to {}, default 1; more than one needs --machine pc-apic): serialized on one "
                              "host thread in a schedule drawn from --schedule-seed (docs/smp.md)",
                              kMaxVcpus));
  cmd->add_option("--schedule-seed", a.schedule_seed,
                  "several vCPUs: the seed of their schedule (default: random, printed); a recording keeps it");
  cmd->add_flag("--tso", a.tso,
               "x86-TSO store buffers on the software CPU (reference executor): each vCPU's stores wait in a FIFO, "
               "drained at locked and serializing instructions, I/O, interrupts and after delays drawn from the "
               "schedule's seed, so that other vCPUs see store-to-load reordering (docs/explore.md)");
  cmd->add_option("--schedule-quantum", a.schedule_quantum,
                  "several vCPUs: the mean slice a vCPU runs before the next takes over, in instructions (guest exits "
                  "with exit-sync progress); default 200000 (32)");
  std::vector<std::string> models;
  for (const CpuModel* m : CpuModel::all()) models.emplace_back(m->name());
  cmd->add_option("--cpu", a.cpu,
                  "CPU model the guest sees: " + CpuModel::names() +
                      " (default: the first of these the backend provides on this host)")
      ->check(CLI::IsMember(models));
  cmd->add_option("--mem", a.mem, "guest RAM size, e.g. 256M or 1G (default 256M)");
  cmd->add_option("--cmdline,--append", a.cmdline,
                  "kernel command line passed to the guest (Multiboot, Linux, fw_cfg); with --linux, added after the "
                  "bundled guest's own");
  cmd->add_option("--serial-in", a.serial_in, "file whose bytes arrive on COM1's receiver ('-' = stdin)");
  cmd->add_option("--serial-out", a.serial_out, "file receiving COM1's output (default '-' = stdout)");
  cmd->add_option("--module", a.modules, "Multiboot boot module: 'PATH' or 'PATH ARGS' (repeatable)");
  cmd->add_option("--progress", a.progress,
                  "where asynchronous events land: exact (any instruction, by branch count: interp, or KVM with a "
                  "usable PMU), exit-sync (only at guest I/O and HLT exits), or emulated-pmu:SKID[:SEED] (interp "
                  "counting like a PMU whose overflow lands up to SKID branches late; for testing). Default: exact "
                  "on interp; on KVM exact when `deja selftest` passes, else exit-sync");
  cmd->add_flag("--stats", a.stats, "print exit counts, unknown ports and unimplemented instructions at the end");
  cmd->add_flag("--digest", a.digest, "print the final state digest (registers, control registers, RAM hash)");
  cmd->add_option("--kernel", a.kernel, "a Linux kernel to boot instead of IMAGE: a bzImage or an ELF vmlinux");
  cmd->add_option("--initrd", a.initrd, "the Linux kernel's initrd or initramfs");
  cmd->add_option("--boot-protocol", a.boot_protocol,
                  "how to enter the Linux kernel: pvh (PVH entry; a bzImage's payload is decompressed by deja), 64bit "
                  "(the bzImage's 64-bit boot protocol: the kernel decompresses itself), or auto (pvh when the "
                  "kernel has a PVH entry)")
      ->check(CLI::IsMember({"auto", "64bit", "pvh"}));
  cmd->add_flag("--linux", a.linux_guest,
                "boot the bundled Linux guest: the installed Debian kernel with the initramfs the build makes "
                "(docs/linux.md)");
  cmd->add_flag("--print-cmdline", a.print_cmdline,
                "print the kernel command line the guest would boot with (e.g. to boot the --linux guest elsewhere) "
                "and exit");
  cmd->add_option("--disk", a.disks,
                  "a virtio-blk disk on a raw image that is never written: FILE[,overlay=FILE] keeps the guest's writes "
                  "in FILE (an overlay; default: memory), [,readonly], [,hash=full|lazy] how a recording identifies "
                  "the image (default: full SHA-256 up to 256 MiB, else per block at first read); repeatable");
  cmd->add_option("--net", a.nets,
                  "a virtio-net NIC on libslirp's user-mode network: user[,hostfwd=tcp:[HOSTADDR]:HOSTPORT-"
                  "[GUESTADDR]:GUESTPORT]...[,tftp=DIR][,guestfwd=tcp:ADDR:PORT-echo][,restrict=on]"
                  "[,mac=52:54:00:12:34:56]; the guest is 10.0.2.15, the host's loopback is 10.0.2.2 (with tftp=DIR "
                  "also a read-only TFTP server of DIR; guestfwd: a TCP echo service at ADDR:PORT; restrict=on: "
                  "nothing of the host's); the MACs count up from 52:54:00:12:34:56; repeatable");
  cmd->add_flag("--rng", a.rng, "a virtio-rng entropy device (its bytes are recorded)");
  cmd->add_option("--libvirt-xml", a.libvirt_xml,
                  "the machine of a libvirt domain's XML (virsh dumpxml): memory, vCPUs, direct kernel boot, raw "
                  "virtio disks, user-mode NICs, serial, rng; whatever deja cannot honour is refused by name")
      ->type_name("FILE");
  cmd->add_option("--libvirt-domain", a.libvirt_domain,
                  libvirt_api_available() ? "the machine of a libvirt domain, fetched by name (read-only) through the "
                                            "libvirt API: as --libvirt-xml"
                                          : "the machine of a libvirt domain by name (this deja was built without the "
                                            "libvirt API: install libvirt-dev and build again)")
      ->type_name("NAME");
  cmd->add_option("--connect", a.libvirt_uri, "the libvirt connection of --libvirt-domain (e.g. qemu:///system, "
                  "test:///default; default: libvirt's)")->type_name("URI");
  cmd->add_option("IMAGE", a.image, "guest image: Multiboot ELF32/ELF64, or ELF64 for direct 64-bit boot");
}

namespace {

// libvirt's <kernel> is QEMU's -kernel, which boots Multiboot images and Linux alike: deja takes an image with a
// Multiboot header (in its first 8 KiB) as IMAGE, anything else as a Linux kernel.
bool multiboot_image(const std::string& path) {
  std::vector<uint8_t> head(8192);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  head.resize(std::fread(head.data(), 1, head.size(), f));
  std::fclose(f);
  auto header = find_multiboot_header(head, path);
  return header && header->has_value();
}

// The options a libvirt domain sets, in place of the command line's: a value given both ways is refused.
Result<> take_domain(const DomainPlan& d, RunArgs& a) {
  std::string both;
  auto take = [&](std::string& option, const std::string& value, const char* name) {
    if (value.empty()) return;  // the domain leaves it to the command line (no <initrd>, no <cmdline>)
    if (!option.empty() && option != value) both += fmt::format(" {}", name);
    option = value;
  };
  if (!a.image.empty() || a.linux_guest) both += a.linux_guest ? " --linux" : " IMAGE";
  take(a.mem, fmt::format("{}", d.memory_bytes), "--mem");
  take(a.machine, d.machine, "--machine");
  if (!d.cpu_model.empty()) take(a.cpu, d.cpu_model, "--cpu");
  take(multiboot_image(d.kernel) ? a.image : a.kernel, d.kernel, "--kernel");
  take(a.initrd, d.initrd, "--initrd");
  take(a.cmdline, d.cmdline, "--cmdline");
  if (!d.serial_out.empty()) {
    if (a.serial_out != "-" && a.serial_out != d.serial_out) both += " --serial-out";
    a.serial_out = d.serial_out;
  }
  if (!a.disks.empty()) both += " --disk";
  if (!a.nets.empty()) both += " --net";
  if (a.rng && !d.rng) both += " --rng";
  a.rng = d.rng;
  if (!both.empty()) {
    return fail(ErrorKind::kInvalidArgument, "{} sets the machine; it cannot be given{} as well (edit the domain "
                "instead)", d.source, both);
  }
  return {};
}

}  // namespace

Result<SessionOptions> to_session(const RunArgs& a) {
  SessionOptions o;
  auto mem = parse_size(a.mem.empty() ? "256M" : a.mem);
  if (!mem) return std::unexpected(Error{ErrorKind::kInvalidArgument, "--mem: " + mem.error().message});
  o.machine.memory_bytes = *mem;
  o.machine.cmdline = a.cmdline;
  o.machine.machine = a.machine.empty() ? std::string(kMachinePc) : a.machine;
  o.machine.interp_mode = a.interp_mode;
  if (a.tso) o.machine.tso = StoreBufferPlan{};  // (its seed is the run's: run_or_record)
  if (a.cpus < 1 || a.cpus > int64_t(kMaxVcpus)) {
    return fail(ErrorKind::kInvalidArgument, "--cpus {}: a machine has 1 to {} vCPUs", a.cpus, kMaxVcpus);
  }
  if (a.cpus > 1 && o.machine.machine != kMachinePcApic) {
    return fail(ErrorKind::kInvalidArgument,
                "--cpus {} needs --machine {}: the PIC-only PC cannot start or interrupt another processor", a.cpus,
                kMachinePcApic);
  }
  if (a.cpus == 1 && (a.schedule_seed || a.schedule_quantum)) {
    return fail(ErrorKind::kInvalidArgument, "--schedule-seed and --schedule-quantum are for several vCPUs (--cpus)");
  }
  o.machine.vcpus = uint32_t(a.cpus);
  o.schedule_seed = a.schedule_seed;
  o.schedule_quantum = a.schedule_quantum;
  if (!a.progress.empty()) {
    auto progress = parse_progress(a.progress);
    if (!progress) return std::unexpected(progress.error());
    o.progress = *progress;
  }
  const int chosen = int(!a.image.empty()) + int(!a.kernel.empty()) + int(a.linux_guest);
  if (chosen != 1) {
    return fail(ErrorKind::kInvalidArgument, "{}",
                chosen == 0 ? "nothing to boot: give a guest IMAGE, a Linux kernel with --kernel, or --linux"
                            : "give only one of a guest IMAGE, --kernel and --linux");
  }
  // An emulated PMU exists only on the software CPU, so asking for one picks it.
  std::string requested = a.backend.empty() && o.progress.emulated_skid ? "interp" : a.backend;
  if (o.progress.emulated_skid && requested != "interp") {
    return fail(ErrorKind::kInvalidArgument, "--progress {} emulates a PMU on the software CPU: use --backend interp",
                a.progress);
  }
  // Store buffers too are the software CPU's, on its reference executor (docs/explore.md).
  if (a.tso) {
    if (requested.empty()) requested = "interp";
    if (requested != "interp") {
      return fail(ErrorKind::kInvalidArgument, "--tso models store buffers on the software CPU: use --backend interp");
    }
    if (!a.interp_mode.empty() && a.interp_mode != "reference") {
      return fail(ErrorKind::kInvalidArgument, "--tso runs on the reference executor only: drop --interp-mode {}",
                  a.interp_mode);
    }
  }
  auto choice = choose_backend(requested, "kvm", a.cpu.empty() ? nullptr : CpuModel::find(a.cpu));
  if (!choice) return std::unexpected(choice.error());
  o.machine.backend = choice->backend;
  o.machine.cpu_model = choice->model;
  o.progress.automatic = a.progress.empty() && o.machine.backend == "kvm";
  o.image_path = a.image;
  o.load.cmdline = a.cmdline;
  if (!a.initrd.empty() && a.kernel.empty() && !a.linux_guest) {
    return fail(ErrorKind::kInvalidArgument, "--initrd is for a Linux kernel: add --kernel");
  }
  if (!a.kernel.empty() || a.linux_guest) {
    auto entry = parse_linux_entry(a.boot_protocol);
    if (!entry) return std::unexpected(entry.error());
    o.load.linux_kernel = true;
    o.load.linux_entry = *entry;
    o.image_path = a.kernel;
    o.load.initrd_path = a.initrd;
    if (a.linux_guest) {
      auto guest = find_linux_guest();
      if (!guest) return std::unexpected(guest.error());
      o.image_path = guest->kernel;
      if (o.load.initrd_path.empty()) o.load.initrd_path = guest->initramfs;
      o.load.cmdline = a.cmdline.empty() ? guest->cmdline : guest->cmdline + " " + a.cmdline;
      o.machine.cmdline = o.load.cmdline;
    }
    if (!a.modules.empty()) return fail(ErrorKind::kInvalidArgument, "--module is for Multiboot images; a Linux kernel takes --initrd");
  }
  for (const auto& m : a.modules) {
    auto space = m.find(' ');
    o.load.modules.push_back(
        {m.substr(0, space), space == std::string::npos ? std::string() : m.substr(space + 1)});
  }
  for (const auto& d : a.disks) {
    auto disk = parse_disk_option(d);
    if (!disk) return std::unexpected(disk.error());
    o.disks.push_back(*disk);
  }
  for (const auto& n : a.nets) {
    auto net = parse_net_option(n);
    if (!net) return std::unexpected(net.error());
    o.nets.push_back(*net);
  }
  o.rng = a.rng;
  o.serial_in = a.serial_in;
  o.serial_out = a.serial_out;
  o.stats = a.stats;
  o.digest_interval = a.digest_every;
  o.checkpoint_every = a.checkpoint_every;
  o.checkpoint_full_every = a.checkpoint_full_every;
  o.print_digest = a.digest;
  // The key is read before anything else happens: a bad key stops the recording before any file is written.
  if (!a.sign.empty()) {
    auto key = SigningKey::load(a.sign);
    if (!key) return std::unexpected(key.error());
    o.signing_key = std::make_shared<const SigningKey>(std::move(*key));
    o.signing_key_path = a.sign;
    o.seals.interval = std::chrono::nanoseconds(int64_t(a.seal_every * 1e9));
    o.seals.chunks = a.seal_chunks;
  }
  o.tsa_request = a.tsa_request;
  return o;
}

namespace {

// The trace header stores these as text: refuse what would make the trace unreadable, naming it.
Result<> check_text(const std::string& what, const std::string& text) {
  if (auto bad = first_invalid_utf8(text)) {
    return fail(ErrorKind::kInvalidArgument,
                "{} is not valid UTF-8 (byte {:#04x} at offset {}); the trace header records it as text (rename the "
                "file, or give a symbolic link with a UTF-8 name)",
                what, uint8_t(text[*bad]), *bad);
  }
  return {};
}

Result<> check_recording_options(const SessionOptions& o) {
  if (auto r = check_text("--cmdline", o.load.cmdline); !r) return r;
  if (auto r = check_text(fmt::format("the image path '{}'", o.image_path), o.image_path); !r) return r;
  for (const auto& m : o.load.modules) {
    if (auto r = check_text(fmt::format("the module path '{}'", m.path), m.path); !r) return r;
    if (auto r = check_text(fmt::format("the arguments of module '{}'", m.path), m.args); !r) return r;
  }
  if (auto r = check_text(fmt::format("the serial input path '{}'", o.serial_in), o.serial_in); !r) return r;
  if (auto r = check_text(fmt::format("the initrd path '{}'", o.load.initrd_path), o.load.initrd_path); !r) return r;
  for (const auto& d : o.disks) {
    if (auto r = check_text(fmt::format("the disk image path '{}'", d.path), d.path); !r) return r;
    if (auto r = check_text(fmt::format("the overlay path '{}'", d.overlay), d.overlay); !r) return r;
  }
  return {};
}

// Every file the run reads and writes, under the one output rule (logging/output_file.h): checked before any is
// opened for writing.
Result<> check_files(const SessionOptions& o, Mode mode) {
  OutputPlan plan;
  plan.add_input(o.load.linux_kernel ? "the Linux kernel" : "the guest image", o.image_path);
  plan.add_input("the initrd", o.load.initrd_path);
  for (const auto& m : o.load.modules) plan.add_input("a boot module", m.path);
  plan.add_input("the serial input", o.serial_in);
  for (const auto& d : o.disks) plan.add_input("a disk image", d.path);
  for (const auto& d : o.disks) {
    if (!d.overlay.empty()) plan.add_output("a disk overlay", d.overlay, OutputKind::kInPlace);
  }
  plan.add_output("the serial output", o.serial_out, OutputKind::kConsole);
  if (mode == Mode::kRecord) plan.add_output("the trace", o.trace_path, OutputKind::kProduct);
  if (mode == Mode::kRecord && o.signing_key) {
    plan.add_input("the signing key", o.signing_key_path);
    plan.add_output("the trace's signature", signature_path(o.trace_path), OutputKind::kProduct);
    plan.add_output("the time-stamp request", o.tsa_request, OutputKind::kProduct);
  }
  return plan.check();
}

// record --checkpoint-every: checkpoints that travel with the trace, taken at the top of a turn once the instruction
// count reaches each multiple of the interval, into TRACE.ckpt.partial (renamed to TRACE.ckpt with the trace).
Result<std::unique_ptr<CheckpointWriter>> start_record_checkpoints(Session& session, const trace::Header& header,
                                                                   const SessionOptions& options) {
  const Backend& cpu = session.machine().backend();
  if (!cpu.instruction_count() || !cpu.step_count()) {
    return fail(ErrorKind::kUnsupported,
                "--checkpoint-every needs a backend that counts instructions (--backend interp); on KVM, make them "
                "after the recording with `deja index TRACE --backend interp`");
  }
  const auto rates = session.engine().derived_time_rates();
  auto every = parse_checkpoint_interval(options.checkpoint_every, rates ? rates->ps_per_instruction : 1000);
  if (!every) return std::unexpected(every.error());
  const std::string serialized = header.SerializeAsString();
  const CheckpointIdentity identity{
      sha256_bytes(std::span(reinterpret_cast<const uint8_t*>(serialized.data()), serialized.size())),
      session.machine().config().memory_bytes, session.machine().config().backend};
  auto writer = CheckpointWriter::create(session, identity,
                                         partial_checkpoint_directory(checkpoint_directory(options.trace_path)),
                                         options.checkpoint_full_every);
  if (!writer) return std::unexpected(writer.error());
  session.set_record_turn_hook([&session, w = writer->get(), every = *every, next = *every]() mutable -> Result<> {
    const uint64_t instructions = session.machine().backend().instruction_count().value_or(0);
    if (instructions < next) return {};
    auto taken = w->take();
    if (taken) {
      next = (instructions / every + 1) * every;
    } else if (taken.error().kind == ErrorKind::kUnsupported) {
      next = instructions + std::max<uint64_t>(1, every / 16);  // no checkpoint just here: a little later
    } else {
      return std::unexpected(taken.error());
    }
    return {};
  });
  return writer;
}

// record --sign: TRACE.sig, and the time-stamp request for it when asked.
int sign_recording(const TraceWriter& writer, const trace::Header& header, const trace::Footer& footer,
                   const SessionOptions& options) {
  auto envelope = sign_finished_trace(writer, header, footer, *options.signing_key);
  if (!envelope) {
    int status = report_error(envelope.error());
    say("the recording in {} is complete and sealed; sign it again with `deja sign {} --key KEY`", writer.path(),
        writer.path());
    return status;
  }
  say("signed: {} ({} seals; key {})", signature_path(writer.path()), writer.seals_written(),
      options.signing_key->id());
  if (!options.tsa_request.empty()) {
    if (auto r = write_timestamp_request(options.tsa_request, *envelope, {writer.path()}); !r) return report_error(r.error());
  }
  return 0;
}

}  // namespace

int run_or_record(const SessionOptions& options, Mode mode) {
  install_stop_signal_handlers();
  if (mode == Mode::kRecord) {
    if (auto ok = check_recording_options(options); !ok) return report_error(ok.error());
  }
  if (auto ok = check_files(options, mode); !ok) return report_error(ok.error());
  if (mode == Mode::kRecord) {
    // A file-size limit (ulimit -f) makes write(2) fail with EFBIG instead of killing deja, so the
    // recording stops with a message and leaves its valid prefix.
    ::signal(SIGXFSZ, SIG_IGN);
  }
  auto inputs = read_guest_inputs(options.image_path, options.load, options.machine.memory_bytes);
  if (!inputs) return report_error(inputs.error());

  MachineConfig config = options.machine;
  trace::Header signed_header;  // record --sign: what TRACE.sig states
  SeededRecording* seeded = options.seeded;
  // A seeded recording starts at a fixed wall-clock time (the RTC's): nothing in it may depend on when it ran.
  int64_t start_unix_ns = seeded ? SeededRecording::kStartUnixNs : host_unix_time_ns();
  config.rtc_epoch_unix_seconds = start_unix_ns / 1'000'000'000;
  // The schedule's seed, drawn here when not given (and said, below), so that a run can be repeated; the store
  // buffers' (--tso) is the same one, or the seeded run's.
  const uint64_t schedule_seed =
      options.schedule_seed ? *options.schedule_seed : config.vcpus > 1 ? std::random_device{}() : 0;
  if (config.tso) config.tso->seed = seeded ? seeded->seed : schedule_seed;

  ProgressChoice progress = options.progress;
  if (progress.automatic) {
    // A plain run places nothing, so only a recording needs the self-test.
    progress.mode = ProgressMode::kExitSync;
    if (mode == Mode::kRecord) {
      PmuSelftest pmu = run_pmu_selftest();
      if (pmu.usable() && config.vcpus > 1) {
        say("note: the host PMU passed the self-test, but exact progress is not implemented for several vCPUs on KVM; "
            "recording exit-synchronously");
      } else if (pmu.usable()) {
        progress.mode = ProgressMode::kExact;
      } else {
        say("warning: no precise interrupt timing on this host ({}); recording exit-synchronously (see `deja "
            "selftest`)",
            pmu.first_failure());
      }
    }
  }
  Session session(mode, progress.mode);
  std::unique_ptr<CheckpointWriter> checkpoints;  // record --checkpoint-every
  // Disks: the images opened read-only (and identified, for a recording), the overlays created or reopened.
  std::vector<std::unique_ptr<DiskImage>> disks;
  std::vector<DiskIdentity> identities;
  for (size_t i = 0; i < options.disks.size(); ++i) {
    auto disk = DiskImage::open(options.disks[i], mode == Mode::kRecord);
    if (!disk) return report_error(disk.error());
    Engine& engine = session.engine();
    (*disk)->set_host_error_handler([&engine](const std::string& m) { engine.host_failure(m); });
    if (mode == Mode::kRecord) {
      auto id = (*disk)->identity(options.disks[i].hash);
      if (!id) return report_error(id.error());
      (*disk)->set_block_checker(&engine, unsigned(i), id->hash_block);  // disk_io events; lazy checks if hashed so
      identities.push_back(*id);
    }
    config.disks.push_back(VirtioDiskSetup{disk->get(), fmt::format("deja-disk{}", i)});
    disks.push_back(std::move(*disk));
  }
  session.adopt_disks(std::move(disks));
  config.nics = unsigned(options.nets.size());
  for (size_t i = 0; i < options.nets.size(); ++i)
    config.nic_macs.push_back(options.nets[i].mac.value_or(nic_mac(unsigned(i))));
  config.rng = options.rng;
  // libslirp writes to host sockets whose peer may have gone (it does not ask for MSG_NOSIGNAL): a broken
  // connection is the guest's EPIPE to see, not a SIGPIPE that kills deja mid-recording (QEMU ignores it too).
  if (!options.nets.empty()) ::signal(SIGPIPE, SIG_IGN);
  for (const NetOptions& net : options.nets) {
    Engine& engine = session.engine();
    auto network = UserNetwork::create(net, [&engine] { return engine.network_now_ns(); });
    if (!network) return report_error(network.error());
    engine.attach_network(std::move(*network));
  }
  std::unique_ptr<FdInput> serial_input;
  if (!options.serial_in.empty()) {
    auto in = FdInput::open(options.serial_in);
    if (!in) return report_error(in.error());
    serial_input = std::move(*in);
  }
  const bool scripted_serial = seeded && seeded->inputs_from;
  if (auto built = session.build(config, options.serial_out, inputs->image, options.image_path, options.load,
                                 inputs->modules, inputs->initrd);
      !built) {
    return report_error(built.error());
  }
  if (auto r = session.setup_progress(progress); !r) return report_error(r.error());
  if (config.vcpus > 1 && seeded && seeded->schedule) {
    if (auto r = session.set_schedule(*seeded->schedule); !r) return report_error(r.error());
  } else if (config.vcpus > 1) {
    const uint64_t seed = schedule_seed;
    ScheduleConfig schedule = default_schedule(
        progress.mode == ProgressMode::kExact && session.machine().backend().instruction_count()
            ? SliceUnit::kInstructions
            : SliceUnit::kGuestExits,
        seed);
    if (options.schedule_quantum) schedule.quantum = *options.schedule_quantum;
    if (auto pause = session.machine().backend().set_pause_exits(true); !pause) {
      // Stock KVM: spin-waits are no switch points. A plain run switches at host-time kicks instead; a recording
      // switches only at guest-caused exits, and says so before the guest runs.
      schedule.pause_limit = 0;
      if (mode == Mode::kRecord) {
        say("warning: {}; the vCPUs switch only at guest-caused exits, so a vCPU that spins waiting for another "
            "without I/O stops the recording; load the kvm-deja module (docs/kvm-deja.md) or record with --backend "
            "interp",
            pause.error().message);
      }
    }
    if (auto r = session.set_schedule(schedule); !r) return report_error(r.error());
    if (!options.schedule_seed) say("note: {} vCPUs, schedule seed {} (repeat with --schedule-seed {})", config.vcpus, seed, seed);
  }
  session.set_digest_interval(options.digest_interval);
  // Where instructions are counted exactly, time read between asynchronous events follows from them: no event per
  // clock or TSC read (format 4). The same in a plain run, so that a run and its recording see the same time.
  const bool derived_time = progress.mode == ProgressMode::kExact && session.machine().backend().instruction_count();
  // With derived time the software CPU answers RDTSC itself: no exit, so none to count as a guest exit.
  session.count_rdtsc_as_guest_exits(session.machine().backend().traps_rdtsc() && !derived_time);
  session.complete_mmio_write_exits(true);
  if (config.vcpus > 1 && progress.mode == ProgressMode::kExitSync) {
    session.step_to_interrupt_windows(Session::kInterruptWindowSteps);
    session.step_windows_by_trap_flag(true);
  }
  if (derived_time) {
    if (auto r = session.derive_time(Engine::TimeRates{}); !r) return report_error(r.error());
  }
  if (seeded) {
    if (auto r = session.engine().simulate_host(Engine::SimulatedHost{seeded->seed, seeded->max_timer_delay_ns}); !r)
      return report_error(r.error());
    session.set_run_limits(seeded->limits);
    if (seeded->faults.any()) session.set_fault_plan(seeded->faults);
    if (seeded->serial_tap) session.set_serial_tap(seeded->serial_tap);
  }

  if (mode == Mode::kRecord) {
    if (const Backend& cpu = session.machine().backend(); !cpu.traps_rdtsc()) {
      // Said before the guest runs: its replay will stop at the first RDTSC whose value mattered.
      say("warning: RDTSC is not trapped here ({}): {}; load the kvm-deja module (docs/kvm-deja.md) or record with "
          "--backend interp",
          cpu.rdtsc_untrapped_reason(),
          options.load.linux_kernel ? "Linux reads the TSC constantly, so this recording cannot replay exactly"
                                    : "a guest that reads the TSC will not replay exactly");
    }
    TraceConfig recorded = recording_config(session, config, options.load, progress.mode);
    recorded.start_unix_ns = start_unix_ns;
    if (seeded) recorded.host = "deja explore";  // (the same on every host: the trace is a function of the seed)
    recorded.libvirt_domain = options.libvirt_domain;
    recorded.inputs.push_back(
        recorded_input(options.load.linux_kernel ? "kernel" : "image", options.image_path, inputs->image));
    if (!options.load.initrd_path.empty()) {
      recorded.inputs.push_back(recorded_input("initrd", options.load.initrd_path, inputs->initrd));
    }
    for (size_t i = 0; i < options.load.modules.size(); ++i) {
      recorded.inputs.push_back(recorded_input("module", options.load.modules[i].path, inputs->modules[i]));
    }
    // Only a regular file is hashed: a FIFO, a terminal or /dev/zero is streamed, its bytes recorded as they
    // arrive, like a real terminal's.
    if (serial_input && serial_input->regular() && options.serial_in != "-") {
      auto hashed = serial_input->content_hash();
      if (!hashed) return report_error(hashed.error());
      recorded.inputs.push_back(RecordedInput{"serial-in", options.serial_in, std::string(hashed->first.begin(),
                                              hashed->first.end()), hashed->second});
    }
    if (scripted_serial) recorded.inputs.push_back(*seeded->inputs_from);
    recorded.serial_input = !options.serial_in.empty() || scripted_serial;
    for (size_t i = 0; i < options.disks.size(); ++i) {
      recorded.disks.push_back(RecordedDisk{options.disks[i].path, identities[i], options.disks[i].read_only,
                                            options.disks[i].overlay, config.disks[i].serial});
    }
    for (const NetOptions& net : options.nets) {
      if (net.tftp_dir.empty()) continue;
      // What the TFTP server at the gateway may hand the guest (the frames are in the trace; this says from where).
      auto hashed = sha256_directory(net.tftp_dir);
      if (!hashed) return report_error(hashed.error());
      recorded.inputs.push_back(RecordedInput{"tftp", net.tftp_dir, std::string(hashed->first.begin(), hashed->first.end()),
                                              hashed->second});
    }
    for (size_t i = 0; i < options.nets.size(); ++i) {
      recorded.nics.push_back(RecordedNic{options.nets[i].forward_texts,
                                          std::string(config.nic_macs[i].begin(), config.nic_macs[i].end())});
    }
    trace::Header header = to_header(recorded);
    if (seeded) *header.mutable_exploration() = seeded->provenance;
    if (options.signing_key) {
      header.mutable_signer()->set_key_id(options.signing_key->id());
      header.mutable_signer()->set_public_key(options.signing_key->public_key().der());
    }
    if (!options.checkpoint_every.empty()) {
      if (auto ok = check_checkpoint_directory(checkpoint_directory(options.trace_path)); !ok) return report_error(ok.error());
    }
    auto writer = TraceWriter::create_replacing(options.trace_path, header);
    if (!writer) return report_error(writer.error());
    // Chunks sealed by size only, not by wall time: the same seed gives the same bytes.
    if (seeded) (*writer)->set_flush_interval(std::chrono::nanoseconds::max());
    if (options.signing_key) {
      if (auto r = (*writer)->set_sealing(options.signing_key, options.seals); !r) return report_error(r.error());
    }
    signed_header = header;
    session.engine().attach_writer(std::move(*writer));
    if (!options.checkpoint_every.empty()) {
      auto started = start_record_checkpoints(session, header, options);
      if (!started) return report_error(started.error());
      checkpoints = std::move(*started);
    }
  }
  if (scripted_serial) {
    session.attach_input(std::make_unique<ScriptedInput>(seeded->scripted_serial));
  } else {
    session.attach_input(std::move(serial_input));
  }

  auto outcome = session.run();
  if (!outcome) {
    // The trace itself could not be written (its valid prefix is what is left), or the backend failed.
    int status = report_error(outcome.error());
    if (mode == Mode::kRecord) {
      const Outcome failed{exit_status::kInterrupted,
                           fmt::format("{}: {}", kHostFailureReason, outcome.error().message), false, false, true};
      if (auto stated_footer = session.finish_recording(failed)) {
        say("the recording up to the failure is complete in {}", options.trace_path);
        if (options.signing_key) sign_recording(*session.engine().writer(), signed_header, *stated_footer, options);
        if (checkpoints) {
          if (auto r = commit_checkpoint_directory(checkpoint_directory(options.trace_path)); !r) report_error(r.error());
        }
      } else if (session.engine().trace_intact()) {
        say("the recording up to the failure is in {} (a valid prefix: `deja replay {}` replays it)",
            session.engine().trace_file(), session.engine().trace_file());
        if (checkpoints) discard_partial_checkpoint_directory(checkpoint_directory(options.trace_path));
      }
    }
    return status;
  }
  if (seeded) {
    seeded->outcome = *outcome;
    seeded->digest = session.final_cpu_ram_digest().hex();
    seeded->schedule_events = session.schedule_events();
    seeded->faults_injected = session.engine().faults_injected();
    const auto& preemptions = session.preemptions();
    for (size_t i = 0; i < preemptions.size(); ++i) {
      seeded->perturbations.push_back(explore::Perturbation{"change-point", preemptions[i].change_point,
                                                            preemptions[i].vcpu, preemptions[i].rip,
                                                            fmt::format("scheduling event {}", preemptions[i].event)});
    }
    for (const Engine::FaultDrawn& f : session.engine().faults_drawn()) {
      if (f.suppressed) continue;
      seeded->perturbations.push_back(
          explore::Perturbation{f.network ? "net-fault" : "fault", f.ordinal, f.where.at.vcpu, f.where.at.rip, f.what});
    }
    for (uint32_t v = 0; v < config.vcpus; ++v) seeded->instructions += session.vcpu_counts(v).instructions;
  }
  finish_outcome_message(*outcome);
  if (options.stats) session.print_stats();
  if (options.print_digest) say("digest {}", session.final_cpu_ram_digest().hex());

  if (mode == Mode::kRecord) {
    auto stated_footer = session.finish_recording(*outcome);
    if (!stated_footer) {
      const auto& r = stated_footer;
      int status = report_error(r.error());
      if (session.engine().trace_intact()) {  // else the error said what became of it
        say("the recording is in {} (a valid prefix: `deja replay {}` replays it)", session.engine().trace_file(),
            session.engine().trace_file());
      }
      if (checkpoints) discard_partial_checkpoint_directory(checkpoint_directory(options.trace_path));
      return status;
    }
    if (checkpoints) {
      const std::string directory = checkpoint_directory(options.trace_path);
      if (auto r = commit_checkpoint_directory(directory); !r) return report_error(r.error());
      say("{} checkpoints in {} ({:.1f} MiB, {:.2f} s CPU on the recording's thread)", checkpoints->checkpoints(),
          directory, double(checkpoints->bytes_written()) / (1 << 20), checkpoints->cpu_seconds());
    }
    // The progress option as given (emulated-pmu:N is exact progress through an emulated counter).
    std::string counter = progress.mode == ProgressMode::kExact ? session.counter_description() : std::string();
    std::string progress_name = counter.starts_with("emulated-pmu") ? counter
                                                                    : std::string(progress_mode_name(progress.mode));
    say("recorded {} events to {} (backend {}, CPU model {}, {} progress){}", session.engine().events_written(),
        options.trace_path, config.backend, config.cpu_model->name(), progress_name,
        outcome->host_failure ? "; it replays to where the host failure stopped it" : "");
    if (options.signing_key) {
      if (int status = sign_recording(*session.engine().writer(), signed_header, *stated_footer, options); status != 0)
        return status;
    }
  }
  // A host failure that stopped the run, or lost output the guest wrote before it exited (the trace has it).
  if (const std::string host = session.host_failure(); !host.empty()) {
    if (!outcome->host_failure) say("{}", host);
    return exit_status::kHostFailure;
  }
  return outcome->status;
}


std::vector<Subcommand> add_run_and_record_commands(CLI::App& app) {
  auto run_args = std::make_shared<RunArgs>();
  auto* run = app.add_subcommand("run", "run a guest");
  add_run_options(run, *run_args);

  auto record_args = std::make_shared<RunArgs>();
  auto* record = app.add_subcommand("record", "run a guest and record every nondeterministic input to a trace");
  record->add_option("-o,--output", record_args->output, "trace file to write (mode 0600)")->required();
  add_run_options(record, *record_args);
  record->add_option("--digest-every", record_args->digest_every,
                     "record a full state digest (registers, RAM, devices) every N events (default 16384); a smaller "
                     "N makes a replay that diverges without a wrong event say so closer to where it happened, at "
                     "the cost of hashing RAM each time")
      ->check(CLI::Range(uint64_t{2}, uint64_t{1} << 32));  // a digest is an event: at 1 it would be due again at once
  record->add_option("--checkpoint-every", record_args->checkpoint_every,
                     "write checkpoints beside the trace (TRACE.ckpt/) every DURATION of guest time (60s, 500ms) or N "
                     "instructions (5G): segments of the trace then replay in parallel (deja verify --replay, "
                     "docs/segments.md); interp");
  record->add_option("--checkpoint-full-every", record_args->checkpoint_full_every,
                     "every Nth checkpoint holds all of RAM, the others what changed since the one before (default 16)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20));
  record->add_option("--sign", record_args->sign,
                     "an Ed25519 private key (PEM, `deja keygen`): seal the trace while recording and write TRACE.sig "
                     "(docs/audit.md)")
      ->type_name("KEY");
  record->add_option("--seal-every", record_args->seal_every,
                     "with --sign: seconds between seals, signed chain values written into the trace so that a killed "
                     "recording stays authenticated up to its last seal (default 10; 0: by --seal-chunks only)")
      ->check(CLI::Range(0.0, 86400.0));
  record->add_option("--seal-chunks", record_args->seal_chunks, "with --sign: also seal every N chunks (default: by time only)");
  record->add_option("--tsa-request", record_args->tsa_request,
                     "with --sign: write an RFC 3161 time-stamp request for the signature to FILE")
      ->type_name("FILE");

  auto start = [](const RunArgs& given, Mode mode) {
    auto domain = domain_for_run(given.libvirt_xml, given.libvirt_domain, given.libvirt_uri);
    if (!domain) return report_error(domain.error());
    RunArgs a = given;
    if (*domain) {
      if (auto r = take_domain(**domain, a); !r) return report_error(r.error());
    }
    auto options = to_session(a);
    if (!options) return report_error(options.error());
    if (*domain) {
      options->disks.insert(options->disks.end(), (*domain)->disks.begin(), (*domain)->disks.end());
      options->nets.insert(options->nets.end(), (*domain)->nets.begin(), (*domain)->nets.end());
      options->libvirt_domain = domain_provenance(**domain);
    }
    if (a.print_cmdline) {
      std::printf("%s\n", options->load.cmdline.c_str());
      return 0;
    }
    options->trace_path = a.output;
    if (!options->signing_key && (!a.tsa_request.empty() || a.seal_chunks != 0))
      return report_error(Error{ErrorKind::kInvalidArgument, "--seal-chunks and --tsa-request go with --sign KEY"});
    return run_or_record(*options, mode);
  };
  return {{run, [run_args, start] { return start(*run_args, Mode::kRun); }},
          {record, [record_args, start] { return start(*record_args, Mode::kRecord); }}};
}

}  // namespace deja
