// open_replay: everything a replay checks before it runs (models, progress, inputs, RDTSC), and a Session ready to run or step.
#include "replay/replay_setup.h"

#include <sys/stat.h>
#include <unistd.h>

#include <charconv>

#include <fmt/format.h>

#include "kvm/pmu.h"
#include "logging/trace_format.h"
#include "logging/trace_reader.h"
#include "replay/backend_choice.h"
#include "replay/trace_config.h"
#include "core/cpu_model.h"
#include "vmm/disk_image.h"
#include "boot/linux_boot.h"
#include "core/messages.h"
#include "core/text.h"

namespace deja {
namespace {

const RecordedInput* find_input(const TraceConfig& t, const std::string& role) {
  for (const RecordedInput& in : t.inputs) {
    if (in.role == role) return &in;
  }
  return nullptr;
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

// open_replay, with messages as they come.
Result<ReplaySetup> open_replay_as_recorded(const ReplaySetupOptions& options) {
  auto reader = TraceReader::open(options.trace_path);
  if (!reader) {
    // A trace that cannot be opened is a bad argument, not a host failure.
    Error e = reader.error();
    if (e.kind == ErrorKind::kHost) e.kind = ErrorKind::kInvalidArgument;
    return std::unexpected(e);
  }
  const trace::Header header = (*reader)->header();
  auto recorded = from_header(header);
  if (!recorded) {
    return std::unexpected(Error{recorded.error().kind, fmt::format("{}: {}", options.trace_path,
                                                                    recorded.error().message)});
  }
  const TraceConfig& rc = *recorded;
  const CpuModel* model = rc.cpu_model;
  ProgressChoice progress;
  progress.mode = rc.progress;

  // The recorded model on the recorded backend where it can run, else on the software CPU.
  auto choice = choose_backend(options.backend, rc.backend, model);
  if (!choice) {
    return std::unexpected(Error{choice.error().kind, fmt::format("{} (CPU model {} of {})", choice.error().message,
                                                          model->name(), options.trace_path)});
  }
  const std::string& backend = choice->backend;
  if (!options.progress.empty()) {
    auto choice = parse_progress(options.progress);
    if (!choice) return std::unexpected(choice.error());
    if (choice->mode != ProgressMode::kExact || progress.mode != ProgressMode::kExact) {
      return std::unexpected(Error{ErrorKind::kInvalidArgument,
                           fmt::format("--progress {}: {} was recorded in {} mode; replay can only choose the counter "
                                       "of an exact-mode trace (exact or emulated-pmu:SKID)",
                                       options.progress, options.trace_path, progress_mode_name(rc.progress))});
    }
    progress = *choice;
  } else if (backend == "interp" && rc.progress_counter.starts_with("emulated-pmu:")) {
    // Replay a trace recorded with an emulated PMU the same way, so that its skid handling is exercised.
    auto choice = parse_progress(rc.progress_counter);
    if (choice) progress = *choice;
  }
  if (backend == "kvm" && progress.mode == ProgressMode::kExact) {
    PmuSelftest pmu = run_pmu_selftest();
    if (!pmu.usable()) {
      return std::unexpected(Error{ErrorKind::kUnsupported,
                           fmt::format("{} places interrupts at exact instruction coordinates (recorded with the {} "
                                       "counter); KVM on this host cannot reach them: {}; replay with --backend interp",
                                       options.trace_path, rc.progress_counter.empty() ? rc.backend
                                                                                       : rc.progress_counter,
                                       pmu.first_failure())});
    }
  }

  LoadOptions load = replay_load(rc);
  const RecordedInput* image_entry = find_input(rc, "image");
  if (!image_entry) {
    // A Linux kernel, loaded with the same boot protocol choice and initrd as recorded.
    image_entry = find_input(rc, "kernel");
    if (!image_entry) return std::unexpected(Error{ErrorKind::kBadTrace, fmt::format("{} names no guest image", options.trace_path)});
    if (!rc.boot_protocol) {
      return std::unexpected(Error{ErrorKind::kBadTrace, fmt::format("{}: its Linux kernel has no boot protocol",
                                                                     options.trace_path)});
    }
  } else {
    load.linux_kernel = false;
  }
  std::string image_path = image_entry->path;
  const RecordedInput* initrd_entry = find_input(rc, "initrd");
  if (!options.image_path.empty()) image_path = options.image_path;
  if (!options.initrd_path.empty()) load.initrd_path = options.initrd_path;
  for (size_t i = 0; i < options.module_paths.size() && i < load.modules.size(); ++i) {
    if (!options.module_paths[i].empty()) load.modules[i].path = options.module_paths[i];
  }
  // The inputs the trace names, one at a time: each file's size is checked against the recorded one before
  // it is read and its SHA-256 right after, so a header naming thousands of files (or a huge one) costs
  // nothing. A trace can name any file on this host: deja never prints a hash of what it read.
  if (load.modules.size() > kMaxBootModules) {
    return std::unexpected(Error{ErrorKind::kBadTrace, fmt::format("{} names {} boot modules; deja boots at most {}",
                                                           options.trace_path, load.modules.size(), kMaxBootModules)});
  }
  uint64_t recorded_bytes = 0;
  for (const RecordedInput& f : rc.inputs) {
    if (f.role != "serial-in") recorded_bytes += f.size;
  }
  if (recorded_bytes > rc.memory_bytes) {
    return std::unexpected(Error{ErrorKind::kBadTrace,
                         fmt::format("{} names inputs of {} bytes in all, more than its guest's {} bytes of RAM",
                                     options.trace_path, recorded_bytes, rc.memory_bytes)});
  }
  auto read_input = [&](const RecordedInput& f, const std::string& path) -> Result<std::vector<uint8_t>> {
    const bool image = f.role == "image" || f.role == "kernel";
    const uint64_t limit = f.size ? f.size : rc.memory_bytes;
    struct stat st {};
    if (f.size && ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && uint64_t(st.st_size) != f.size) {
      return fail(ErrorKind::kInvalidArgument,
                  "{} differs from the {} recorded in {}: {} bytes here, {} recorded (the recording's SHA-256 is {})",
                  path, f.role, options.trace_path, st.st_size, f.size, hex(f.sha256));
    }
    auto bytes = f.role == "image"    ? read_guest_image(path, limit)
                 : f.role == "kernel" ? read_boot_file(path, "Linux kernel", limit)
                 : f.role == "initrd" ? read_boot_file(path, "initrd", limit)
                                      : read_boot_file(path, "boot module", limit);
    if (!bytes) {
      Error e = bytes.error();
      if (image && options.image_path.empty() && !path.starts_with("/")) {
        e.message += fmt::format(" (the trace names it relative to the directory it was recorded in; give its location "
                                 "with --image)");
      }
      return std::unexpected(e);
    }
    auto sha = sha256_bytes(*bytes);
    if ((f.size && bytes->size() != f.size) ||
        std::string(reinterpret_cast<const char*>(sha.data()), sha.size()) != f.sha256) {
      return fail(ErrorKind::kInvalidArgument,
                  "{} differs from the {} recorded in {}: its SHA-256 differs from the recording's {} ({} bytes here, "
                  "{} recorded)",
                  path, f.role, options.trace_path, hex(f.sha256), bytes->size(), f.size);
    }
    return bytes;
  };
  GuestInputs inputs;
  if (auto bytes = read_input(*image_entry, image_path); bytes) {
    inputs.image = std::move(*bytes);
  } else {
    return std::unexpected(bytes.error());
  }
  if (initrd_entry) {
    auto bytes = read_input(*initrd_entry, load.initrd_path);
    if (!bytes) return std::unexpected(bytes.error());
    inputs.initrd = std::move(*bytes);
  }
  size_t module_index = 0;
  for (const RecordedInput& f : rc.inputs) {
    if (f.role != "module") continue;
    auto bytes = read_input(f, load.modules[module_index].path);
    if (!bytes) return std::unexpected(bytes.error());
    inputs.modules.push_back(std::move(*bytes));
    ++module_index;
  }

  MachineConfig config = replay_machine(rc, backend);
  config.interp_mode = options.interp_mode;
  if (!options.test_device_semantics.empty()) config.device_semantics = options.test_device_semantics;

  ReplaySetup setup;
  setup.session = std::make_unique<Session>(Mode::kReplay, progress.mode);
  Session& session = *setup.session;
  // Disks: each image checked against the recording (size, and SHA-256 up front in full mode; block by block in
  // lazy mode); the guest's writes stay in memory. No network runs: received frames are in the trace.
  if (options.disk_paths.size() > rc.disks.size()) {
    return std::unexpected(Error{ErrorKind::kInvalidArgument,
                                 fmt::format("--disk: {} images given, {} recorded {}", options.disk_paths.size(),
                                             options.trace_path, rc.disks.size())});
  }
  std::vector<std::unique_ptr<DiskImage>> disks;
  std::vector<std::string> disk_names;
  for (size_t i = 0; i < rc.disks.size(); ++i) {
    const RecordedDisk& d = rc.disks[i];
    std::string path = i < options.disk_paths.size() && !options.disk_paths[i].empty() ? options.disk_paths[i] : d.path;
    auto disk = DiskImage::open_for_replay(path, d.identity, d.read_only);
    if (!disk) {
      Error e = disk.error();
      if (options.disk_paths.empty() && !path.starts_with("/")) {
        e.message += " (the trace names it relative to the directory it was recorded in; give its location with --disk)";
      }
      return std::unexpected(e);
    }
    Engine& engine = session.engine();
    (*disk)->set_host_error_handler([&engine](const std::string& m) { engine.host_failure(m); });
    if (d.identity.hash_block) (*disk)->set_block_checker(&engine, unsigned(i), d.identity.hash_block);
    (*disk)->keep_history(options.rewind);
    config.disks.push_back(VirtioDiskSetup{disk->get(), d.serial});
    disk_names.push_back(path);
    disks.push_back(std::move(*disk));
  }
  session.adopt_disks(std::move(disks));
  // The one output rule: the serial output and the caller's files are none of the replay's inputs.
  OutputPlan files = options.files;
  files.add_input("the trace", options.trace_path);
  files.add_input(load.linux_kernel ? "the Linux kernel" : "the guest image", image_path);
  files.add_input("the initrd", load.initrd_path);
  for (const auto& m : load.modules) files.add_input("a boot module", m.path);
  for (const auto& d : disk_names) files.add_input("a disk image", d);
  files.add_output("the serial output", options.serial_out, OutputKind::kConsole);
  if (auto ok = files.check(); !ok) return std::unexpected(ok.error());
  for (auto& name : disk_names) name = printable(name);  // named in messages: as the trace's other strings
  session.engine().set_disk_names(std::move(disk_names));
  if (auto built = session.build_machine(config, options.serial_out); !built) return std::unexpected(built.error());
  if (!options.restores_checkpoint) {
    if (auto loaded = session.load_image(inputs.image, image_path, load, inputs.modules, inputs.initrd); !loaded) {
      return std::unexpected(loaded.error());
    }
  }
  if (auto ok = adopt_recording_ways(session, rc); !ok) {
    return std::unexpected(Error{ok.error().kind, fmt::format("{}: {}", options.trace_path, ok.error().message)});
  }
  if (auto ok = check_rdtsc_replayable(header, session.machine().backend(), options.trace_path); !ok) {
    return std::unexpected(ok.error());
  }
  if (auto r = session.setup_progress(progress); !r) return std::unexpected(r.error());
  if (options.rewind) session.engine().enable_rewind();
  session.engine().attach_reader(std::move(*reader));
  setup.header = header;
  std::string serialized = header.SerializeAsString();
  setup.identity.trace_header_sha256 =
      sha256_bytes(std::span(reinterpret_cast<const uint8_t*>(serialized.data()), serialized.size()));
  setup.identity.ram_bytes = config.memory_bytes;
  setup.identity.backend = backend;
  return setup;
}

}  // namespace

Result<ReplaySetup> open_replay(const ReplaySetupOptions& options) {
  auto setup = open_replay_as_recorded(options);
  // Its refusals name what the trace holds (paths, model names): escaped, so that a trace cannot forge a line.
  if (!setup) return std::unexpected(Error{setup.error().kind, printable(setup.error().message)});
  return setup;
}

Result<std::pair<uint64_t, uint64_t>> parse_range(const std::string& text, uint64_t max_length) {
  auto number = [](std::string_view s) -> std::optional<uint64_t> {
    uint64_t v = 0;
    int base = 10;
    if (s.starts_with("0x") || s.starts_with("0X")) {
      s.remove_prefix(2);
      base = 16;
    }
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
    if (ec != std::errc() || ptr != s.data() + s.size() || s.empty()) return std::nullopt;
    return v;
  };
  size_t colon = text.find(':');
  if (colon == std::string::npos) return fail(ErrorKind::kInvalidArgument, "'{}' is not ADDR:LEN", text);
  auto addr = number(std::string_view(text).substr(0, colon));
  auto len = number(std::string_view(text).substr(colon + 1));
  if (!addr || !len || *len == 0) return fail(ErrorKind::kInvalidArgument, "'{}' is not ADDR:LEN (e.g. 0x1000:8)", text);
  if (*len > max_length) return fail(ErrorKind::kInvalidArgument, "'{}': at most {} bytes", text, max_length);
  if (*addr + *len < *addr) return fail(ErrorKind::kInvalidArgument, "'{}' wraps around the address space", text);
  return std::pair{*addr, *len};
}

}  // namespace deja
