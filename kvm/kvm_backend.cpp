// KvmBackend: drives one KVM vCPU and translates kvm_run exits into deja's typed VcpuExit (the only file that includes <linux/kvm.h>).
#include "kvm/kvm_backend.h"

#include "kvm/perf_counter.h"

#include <fcntl.h>
#include <linux/kvm.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvm/kvm_deja.h"
#include "kvm/kvm_usability.h"

namespace deja {
namespace {

// The kick signal: blocked in the vCPU thread except inside KVM_RUN (KVM_SET_SIGNAL_MASK), so a kick that
// lands outside KVM_RUN stays pending instead of being lost, and one inside makes KVM_RUN return EINTR.
constexpr int kKickSignal = SIGUSR1;

void ignore_kick_signal(int) {}

std::string errno_text(int error) { return std::strerror(error); }


SegmentReg from_kvm(const kvm_segment& s) {
  return SegmentReg{.base = s.base, .limit = s.limit, .selector = s.selector, .type = s.type, .dpl = s.dpl,
                    .present = s.present != 0, .s = s.s != 0, .db = s.db != 0, .l = s.l != 0, .g = s.g != 0,
                    .avl = s.avl != 0, .unusable = s.unusable != 0};
}

kvm_segment to_kvm(const SegmentReg& s) {
  kvm_segment k{};
  k.base = s.base;
  k.limit = s.limit;
  k.selector = s.selector;
  k.type = s.type;
  k.dpl = s.dpl;
  k.present = s.present;
  k.s = s.s;
  k.db = s.db;
  k.l = s.l;
  k.g = s.g;
  k.avl = s.avl;
  k.unusable = s.unusable;
  return k;
}

// MSRs in MsrState that live in the vCPU; EFER and FS/GS base travel in kvm_sregs instead.
constexpr uint32_t kStateMsrs[] = {msr::kStar,        msr::kLstar,       msr::kCstar,
                                   msr::kSfmask,      msr::kKernelGsBase, msr::kSysenterCs,
                                   msr::kSysenterEsp, msr::kSysenterEip, msr::kPat};

uint64_t* state_msr_field(MsrState& m, uint32_t index) {
  switch (index) {
    case msr::kStar: return &m.star;
    case msr::kLstar: return &m.lstar;
    case msr::kCstar: return &m.cstar;
    case msr::kSfmask: return &m.sfmask;
    case msr::kKernelGsBase: return &m.kernel_gs_base;
    case msr::kSysenterCs: return &m.sysenter_cs;
    case msr::kSysenterEsp: return &m.sysenter_esp;
    case msr::kSysenterEip: return &m.sysenter_eip;
    case msr::kPat: return &m.pat;
    default: return nullptr;
  }
}

// The uapi headers declare flexible arrays with __DECLARE_FLEX_ARRAY, whose empty struct occupies a byte
// in C++ and shifts the array away from where the (C) kernel reads it. These are the kernel's C layouts.
struct MsrBuffer {  // struct kvm_msrs
  uint32_t nmsrs;
  uint32_t pad;
  kvm_msr_entry entries[std::size(kStateMsrs)];
};
struct CpuidHeader {  // struct kvm_cpuid2, followed by `nent` kvm_cpuid_entry2
  uint32_t nent;
  uint32_t padding;
};
constexpr size_t kCpuidEntriesOffset = sizeof(CpuidHeader);
struct SignalMask {  // struct kvm_signal_mask with the kernel's 8-byte sigset
  uint32_t len;
  uint8_t sigset[8];
};

struct MsrHeader {  // struct kvm_msrs without its entries
  uint32_t nmsrs;
  uint32_t pad;
};
struct SignalMaskHeader {  // struct kvm_signal_mask without its sigset
  uint32_t len;
};
// The ioctl numbers encode sizeof() of those structs, so the C++ sizes would name ioctls the kernel does not
// know (EINVAL); these are the numbers a C program gets.
constexpr unsigned long kGetSupportedCpuid = _IOWR(KVMIO, 0x05, CpuidHeader);
constexpr unsigned long kSetCpuid2 = _IOW(KVMIO, 0x90, CpuidHeader);
constexpr unsigned long kGetMsrs = _IOWR(KVMIO, 0x88, MsrHeader);
constexpr unsigned long kSetMsrs = _IOW(KVMIO, 0x89, MsrHeader);
struct XsaveRegion {  // struct kvm_xsave without `extra`
  uint32_t region[1024];
};
constexpr unsigned long kGetXsave = _IOR(KVMIO, 0xa4, XsaveRegion);
constexpr unsigned long kSetXsave = _IOW(KVMIO, 0xa5, XsaveRegion);
constexpr unsigned long kGetXsave2 = _IOR(KVMIO, 0xcf, XsaveRegion);
constexpr unsigned long kSetSignalMask = _IOW(KVMIO, 0x8b, SignalMaskHeader);
// Offsets in KVM's XSAVE area (the standard format): the header, the AVX component (YMM0-15 bits 128-255).
constexpr size_t kXsaveHeader = 512, kXsaveAvx = 576;

kvm_cpuid_entry2* cpuid_entries(std::vector<uint8_t>& buffer) {
  return reinterpret_cast<kvm_cpuid_entry2*>(buffer.data() + kCpuidEntriesOffset);
}

class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~FileDescriptor() { reset(); }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// A descriptor of the VM that every vCPU's backend holds: the last one closes it.
class SharedFd {
 public:
  SharedFd() = default;
  explicit SharedFd(int fd) : fd_(std::make_shared<FileDescriptor>(fd)) {}
  int get() const { return fd_ ? fd_->get() : -1; }

 private:
  std::shared_ptr<FileDescriptor> fd_;
};

class KvmBackend final : public Backend, public KvmVcpu {
 public:
  // vCPU `index` of `count`: the first creates the VM, the others join `first`'s.
  static Result<std::unique_ptr<KvmBackend>> create(const KvmBackend* first, GuestMemory& memory,
                                                    const CpuModel& model, uint32_t index, uint32_t count,
                                                    const KvmOptions& options);
  ~KvmBackend() override;

  std::string_view name() const override { return "kvm"; }
  bool traps_rdtsc() const override { return (deja_.mask & KVM_DEJA_RDTSC) != 0; }
  std::string rdtsc_untrapped_reason() const override { return deja_.why_not; }
  // What the usability check measured on this host's KVM (the vCPU itself cannot be told otherwise).
  std::vector<std::string> cpu_quirks() const override { return kvm_usability().cpu_quirks; }
  Result<> adopt_cpu_quirks(std::span<const std::string> quirks) override {
    const std::vector<std::string> here = cpu_quirks();
    if (std::equal(quirks.begin(), quirks.end(), here.begin(), here.end())) return {};
    return fail(ErrorKind::kUnsupported, "the trace was recorded on a CPU with quirks [{}], this host's KVM has [{}]",
                fmt::join(quirks, ", "), fmt::join(here, ", "));
  }
  Result<VcpuExit*> run() override;
  Result<CpuState> get_state() override;
  Result<> set_state(const CpuState& state) override;
  bool can_inject_interrupt() override;
  Result<> inject_interrupt(uint8_t vector) override;
  Result<> inject_nmi() override;
  Result<> set_pause_exits(bool on) override;
  void request_interrupt_window(bool enable) override;
  void kick() override;
  ProgressCounter* progress_counter() override { return counter_.get(); }
  std::optional<uint64_t> instruction_count() const override { return std::nullopt; }
  Result<> set_debug(const DebugControl& control) override;
  Result<> start_dirty_log() override;
  Result<> sync_dirty_log() override;

  volatile uint8_t* immediate_exit_flag() override { return &run_->immediate_exit; }
  void adopt_progress_counter(std::unique_ptr<ProgressCounter> counter) override { counter_ = std::move(counter); }

 private:
  KvmBackend() = default;
  Result<> setup_vm(GuestMemory& memory, const KvmOptions& options, uint32_t count);
  Result<> setup_vcpu(const CpuModel& model, uint32_t index);
  Result<> check_capabilities();
  Result<> setup_cpuid(const CpuModel& model);
  Result<> setup_msr_filter();
  Result<> prepare_kick_signal();
  // The x87/SSE state in FXSAVE layout and the upper halves of the YMM registers (XSAVE's AVX component).
  Result<> get_fxsave(std::array<uint8_t, 512>& fx, std::array<uint8_t, 256>& ymmh, uint64_t& xinuse);
  Result<> set_fxsave(const std::array<uint8_t, 512>& fx, const std::array<uint8_t, 256>& ymmh, uint64_t xinuse);
  void complete_previous_exit();
  Result<VcpuExit*> run_once();  // one KVM_RUN
  Result<VcpuExit*> translate_exit();
  VcpuExit* emit_io_element();
  VcpuExit* finish(ExitKind kind);
  VcpuExit* stop_with_diagnostic(ExitKind kind, std::string reason);
  uint64_t current_rip();

  SharedFd kvm_;
  SharedFd vm_;
  FileDescriptor vcpu_;
  kvm_run* run_ = nullptr;
  size_t run_size_ = 0;
  bool sync_regs_ = false;
  size_t xsave_size_ = 0;  // 0: no XSAVE support, x87/SSE state goes through KVM_GET/SET_FPU
  bool xcrs_ = false;      // KVM_GET/SET_XCRS: XCR0 lives in KVM (else it can only be 1, x87 alone)
  bool xsave2_ = false;
  bool tsc_pinned_ = false;
  kvm_deja::Enabled deja_;  // RDTSC/RDRAND exits of the kvm-deja module, when loaded (docs/kvm-deja.md)
  bool pause_exits_ = false;  // set_pause_exits: the VM's PAUSE exits reach the caller (else run() goes on)
  // The last exit was a PAUSE that also ended a single step: the step's kDebug comes next, without running (the
  // software CPU reports a PAUSE it stepped over the same way).
  bool step_owed_ = false;
  // The last exit was an MMIO write, whose instruction KVM's emulator completed before exiting: the next KVM_RUN
  // enters the guest at the next instruction without reporting a step, so a single step owes one (see run()).
  bool write_completed_at_exit_ = false;
  // What set_debug last gave KVM_SET_GUEST_DEBUG: single-stepping is armed again before every KVM_RUN (see run()).
  kvm_guest_debug guest_debug_{};

  VcpuExit exit_;
  // A string or REP I/O exit is handed to the VMM one element at a time; this is where we are in it.
  struct SplitIo {
    bool active = false;
    uint32_t index = 0;
    uint32_t count = 0;
  } io_;
  bool needs_completion_ = false;  // exit_ is an exit whose response must be copied into kvm_run
  bool injected_since_exit_ = false;
  bool state_set_since_exit_ = true;
  bool halted_ = false;
  GuestMemory* ram_ = nullptr;  // slot 0
  bool dirty_log_ = false;      // KVM_MEM_LOG_DIRTY_PAGES set on slot 0 (through this vCPU's backend)

  // Parts of CpuState that KVM does not hold for deja (VMM-emulated or outside kvm_fpu), kept so that
  // set_state followed by get_state returns what was set.
  uint64_t tsc_aux_ = 0;
  std::array<uint8_t, 512> fxsave_shadow_{};

  std::atomic<pthread_t> vcpu_thread_{};
  std::atomic<bool> vcpu_thread_known_{false};
  bool signal_mask_set_ = false;
  std::unique_ptr<ProgressCounter> counter_;  // the host PMU counter, once attach_pmu_counter succeeded

  struct RecentExit {
    ExitKind kind;
    uint64_t rip;
    uint64_t where;  // port, MMIO address or MSR index
  };
  static constexpr size_t kRecentExits = 16;
  std::array<RecentExit, kRecentExits> recent_{};
  uint64_t exit_serial_ = 0;
};

Result<std::unique_ptr<KvmBackend>> KvmBackend::create(const KvmBackend* first, GuestMemory& memory,
                                                      const CpuModel& model, uint32_t index, uint32_t count,
                                                      const KvmOptions& options) {
  std::unique_ptr<KvmBackend> backend(new KvmBackend());
  if (!first) {
    if (auto ok = backend->setup_vm(memory, options, count); !ok) return std::unexpected(ok.error());
  } else {
    backend->kvm_ = first->kvm_;
    backend->vm_ = first->vm_;
    backend->deja_ = first->deja_;
    backend->ram_ = first->ram_;
    if (auto ok = backend->check_capabilities(); !ok) return std::unexpected(ok.error());
  }
  if (auto ok = backend->setup_vcpu(model, index); !ok) return std::unexpected(ok.error());
  return backend;
}

KvmBackend::~KvmBackend() {
  if (run_ != nullptr) ::munmap(run_, run_size_);
}

Result<> KvmBackend::check_capabilities() {
  int version = ::ioctl(kvm_.get(), KVM_GET_API_VERSION, 0);
  if (version != KVM_API_VERSION) {
    return fail(ErrorKind::kUnsupported, "/dev/kvm speaks KVM API version {}, deja needs version {}", version,
                KVM_API_VERSION);
  }
  struct Required {
    int cap;
    const char* name;
  };
  static constexpr Required kRequired[] = {
      {KVM_CAP_USER_MEMORY, "KVM_CAP_USER_MEMORY"},
      {KVM_CAP_SET_TSS_ADDR, "KVM_CAP_SET_TSS_ADDR"},
      {KVM_CAP_EXT_CPUID, "KVM_CAP_EXT_CPUID"},
      {KVM_CAP_VCPU_EVENTS, "KVM_CAP_VCPU_EVENTS"},
      {KVM_CAP_IMMEDIATE_EXIT, "KVM_CAP_IMMEDIATE_EXIT"},
      {KVM_CAP_X86_USER_SPACE_MSR, "KVM_CAP_X86_USER_SPACE_MSR"},
      {KVM_CAP_X86_MSR_FILTER, "KVM_CAP_X86_MSR_FILTER"},
  };
  for (const auto& required : kRequired) {
    if (::ioctl(kvm_.get(), KVM_CHECK_EXTENSION, required.cap) <= 0) {
      return fail(ErrorKind::kUnsupported, "this host's KVM lacks {}, which deja needs (Linux 5.10 or newer has it)",
                  required.name);
    }
  }
  sync_regs_ = (::ioctl(kvm_.get(), KVM_CHECK_EXTENSION, KVM_CAP_SYNC_REGS) & KVM_SYNC_X86_REGS) != 0;
  xcrs_ = ::ioctl(kvm_.get(), KVM_CHECK_EXTENSION, KVM_CAP_XCRS) > 0;
  if (::ioctl(kvm_.get(), KVM_CHECK_EXTENSION, KVM_CAP_XSAVE) > 0) {
    int size2 = ::ioctl(kvm_.get(), KVM_CHECK_EXTENSION, KVM_CAP_XSAVE2);
    xsave2_ = size2 > 0;
    xsave_size_ = std::max<size_t>(sizeof(XsaveRegion), size2 > 0 ? size_t(size2) : 0);
  }
  return {};
}

Result<> KvmBackend::setup_vm(GuestMemory& memory, const KvmOptions& options, uint32_t count) {
  int fd = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    int error = errno;
    if (error == ENOENT) {
      return fail(ErrorKind::kUnsupported,
                  "/dev/kvm does not exist: this host has no KVM (use --backend interp, or run inside "
                  "scripts/kvm-nested.sh)");
    }
    if (error == EACCES || error == EPERM) {
      return fail(ErrorKind::kUnsupported,
                  "/dev/kvm is not accessible ({}): add this user to the 'kvm' group, or use --backend interp",
                  errno_text(error));
    }
    return fail(ErrorKind::kUnsupported, "cannot open /dev/kvm: {}", errno_text(error));
  }
  kvm_ = SharedFd(fd);
  if (auto ok = check_capabilities(); !ok) return ok;

  if (memory.size() > kKvmReservedBase) {
    return fail(ErrorKind::kInvalidArgument,
                "guest RAM of {} MiB overlaps the pages KVM reserves at {:#x}: use at most {} MiB with --backend kvm",
                memory.size() >> 20, kKvmReservedBase, kKvmReservedBase >> 20);
  }

  int vm = ::ioctl(kvm_.get(), KVM_CREATE_VM, 0);
  if (vm < 0) return fail(ErrorKind::kHost, "KVM_CREATE_VM failed: {}", errno_text(errno));
  vm_ = SharedFd(vm);

  // Both must be set before the vCPU exists; KVM would otherwise pick addresses that may lie in RAM.
  uint64_t identity_map = kKvmIdentityMapGpa;
  if (::ioctl(vm_.get(), KVM_SET_IDENTITY_MAP_ADDR, &identity_map) < 0) {
    return fail(ErrorKind::kHost, "KVM_SET_IDENTITY_MAP_ADDR({:#x}) failed: {}", identity_map, errno_text(errno));
  }
  if (::ioctl(vm_.get(), KVM_SET_TSS_ADDR, static_cast<unsigned long>(kKvmTssGpa)) < 0) {
    return fail(ErrorKind::kHost, "KVM_SET_TSS_ADDR({:#x}) failed: {}", kKvmTssGpa, errno_text(errno));
  }

  kvm_userspace_memory_region region{};
  region.slot = 0;
  region.guest_phys_addr = 0;
  region.memory_size = memory.size();
  region.userspace_addr = reinterpret_cast<uint64_t>(memory.host_base());
  if (::ioctl(vm_.get(), KVM_SET_USER_MEMORY_REGION, &region) < 0) {
    return fail(ErrorKind::kHost, "KVM_SET_USER_MEMORY_REGION ({} bytes of RAM at GPA 0) failed: {}", memory.size(),
                errno_text(errno));
  }
  ram_ = &memory;

  kvm_enable_cap msr_exits{};
  msr_exits.cap = KVM_CAP_X86_USER_SPACE_MSR;
  msr_exits.args[0] = KVM_MSR_EXIT_REASON_FILTER | KVM_MSR_EXIT_REASON_UNKNOWN | KVM_MSR_EXIT_REASON_INVAL;
  if (::ioctl(vm_.get(), KVM_ENABLE_CAP, &msr_exits) < 0) {
    return fail(ErrorKind::kUnsupported, "enabling KVM_CAP_X86_USER_SPACE_MSR failed: {}", errno_text(errno));
  }
  if (auto ok = setup_msr_filter(); !ok) return ok;
  // Before the vCPUs exist: the module sets its intercepts when a vCPU is created. PAUSE exits only where several
  // vCPUs take turns (a one-vCPU machine's exits stay what they were).
  auto deja = kvm_deja::enable(kvm_.get(), vm_.get(), options.trap_rdtsc, count > 1);
  if (!deja) return std::unexpected(deja.error());
  deja_ = *deja;
  return {};
}

Result<> KvmBackend::setup_vcpu(const CpuModel& model, uint32_t index) {
  int vcpu = ::ioctl(vm_.get(), KVM_CREATE_VCPU, index);
  if (vcpu < 0) return fail(ErrorKind::kHost, "KVM_CREATE_VCPU failed: {}", errno_text(errno));
  vcpu_ = FileDescriptor(vcpu);
  int mmap_size = ::ioctl(kvm_.get(), KVM_GET_VCPU_MMAP_SIZE, 0);
  if (mmap_size < static_cast<int>(sizeof(kvm_run))) {
    return fail(ErrorKind::kHost, "KVM_GET_VCPU_MMAP_SIZE returned {}: {}", mmap_size, errno_text(errno));
  }
  void* mapped = ::mmap(nullptr, mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED, vcpu_.get(), 0);
  if (mapped == MAP_FAILED) return fail(ErrorKind::kHost, "mmap of kvm_run failed: {}", errno_text(errno));
  run_ = static_cast<kvm_run*>(mapped);
  run_size_ = static_cast<size_t>(mmap_size);
  if (sync_regs_) run_->kvm_valid_regs = KVM_SYNC_X86_REGS;

  if (auto ok = setup_cpuid(model); !ok) return ok;

  // deja's machine has no local APIC in the vCPU: on pc-apic it is a VMM device (devices/lapic.*, its
  // IA32_APIC_BASE emulated through the MSR filter). KVM derives CPUID.01H:EDX.APIC from its own APIC_BASE
  // enable bit, so set that bit exactly when the model advertises an APIC, or KVM would hide or invent one.
  kvm_sregs sregs{};
  if (::ioctl(vcpu_.get(), KVM_GET_SREGS, &sregs) < 0) {
    return fail(ErrorKind::kHost, "KVM_GET_SREGS failed: {}", errno_text(errno));
  }
  // IA32_APIC_BASE: the BSP flag (bit 8) on vCPU 0; global enable (bit 11) as the model says.
  sregs.apic_base = (model.has(feature("APIC")) ? 0xfee00800 : 0) | (index == 0 ? 0x100 : 0);
  if (::ioctl(vcpu_.get(), KVM_SET_SREGS, &sregs) < 0) {
    return fail(ErrorKind::kHost, "setting KVM's APIC base (KVM_SET_SREGS apic_base={:#x}) failed: {}",
                sregs.apic_base, errno_text(errno));
  }

  // Without TSC scaling in the host CPU, KVM refuses a rate other than the host's; the guest TSC then ticks
  // at host speed, which only matters for the (undetected) RDTSC nondeterminism documented in docs/kvm.md.
  if (::ioctl(kvm_.get(), KVM_CHECK_EXTENSION, KVM_CAP_TSC_CONTROL) > 0) {
    tsc_pinned_ = ::ioctl(vcpu_.get(), KVM_SET_TSC_KHZ, static_cast<unsigned long>(CpuModel::kTscHz / 1000)) == 0;
  }
  return {};
}

Result<> KvmBackend::setup_cpuid(const CpuModel& model) {
  // What the host can virtualize; grown until KVM stops answering E2BIG.
  std::vector<uint8_t> supported_buffer;
  CpuidHeader* supported = nullptr;
  for (uint32_t capacity = 128; capacity <= 4096; capacity *= 2) {
    supported_buffer.assign(kCpuidEntriesOffset + capacity * sizeof(kvm_cpuid_entry2), 0);
    supported = reinterpret_cast<CpuidHeader*>(supported_buffer.data());
    supported->nent = capacity;
    if (::ioctl(kvm_.get(), kGetSupportedCpuid, supported) == 0) break;
    if (errno != E2BIG) return fail(ErrorKind::kHost, "KVM_GET_SUPPORTED_CPUID failed: {}", errno_text(errno));
    supported = nullptr;
  }
  if (supported == nullptr) return fail(ErrorKind::kHost, "KVM_GET_SUPPORTED_CPUID needs more than 4096 entries");
  const kvm_cpuid_entry2* supported_entries = cpuid_entries(supported_buffer);
  auto host_has = [&](uint32_t leaf, uint32_t subleaf) -> CpuidResult {
    for (uint32_t i = 0; i < supported->nent; ++i) {
      const auto& e = supported_entries[i];
      bool indexed = (e.flags & KVM_CPUID_FLAG_SIGNIFCANT_INDEX) != 0;
      if (e.function == leaf && (!indexed || e.index == subleaf)) return {e.eax, e.ebx, e.ecx, e.edx};
    }
    return {};
  };
  for (const CpuFeature& f : model.hardware_features()) {
    if (!((cpuid_register(host_has(f.leaf, f.subleaf), f.reg) >> f.bit) & 1)) {
      return fail(ErrorKind::kUnsupported,
                  "this host's KVM cannot provide CPU feature {} that CPU model {} (v{}) advertises", f.label(),
                  model.name(), model.version());
    }
  }

  // The XSAVE state components (leaf 0DH sub-leaf 0 EDX:EAX) and instructions (sub-leaf 1 EAX: XSAVEOPT, XSAVEC,
  // XGETBV with ECX = 1, XSAVES) the model offers must be the host's too.
  if (model.has(feature("XSAVE"))) {
    const CpuidResult components = model.cpuid(0xd, 0), host_components = host_has(0xd, 0);
    const CpuidResult instructions = model.cpuid(0xd, 1), host_instructions = host_has(0xd, 1);
    if ((components.eax & ~host_components.eax) || (components.edx & ~host_components.edx) ||
        (instructions.eax & 0xf & ~host_instructions.eax)) {
      return fail(ErrorKind::kUnsupported,
                  "this host's KVM cannot provide the XSAVE features of CPU model {} (v{}): state components {:#x}, "
                  "instructions {:#x} (CPUID.0DH), where it has {:#x} and {:#x}",
                  model.name(), model.version(), components.eax, instructions.eax & 0xf, host_components.eax,
                  host_instructions.eax & 0xf);
    }
  }

  auto entries = model.entries();
  std::vector<uint8_t> buffer(kCpuidEntriesOffset + entries.size() * sizeof(kvm_cpuid_entry2), 0);
  auto* cpuid = reinterpret_cast<CpuidHeader*>(buffer.data());
  cpuid->nent = static_cast<uint32_t>(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    auto& out = cpuid_entries(buffer)[i];
    out.function = entries[i].function;
    out.index = entries[i].index;
    out.flags = entries[i].indexed ? KVM_CPUID_FLAG_SIGNIFCANT_INDEX : 0;
    out.eax = entries[i].result.eax;
    out.ebx = entries[i].result.ebx;
    out.ecx = entries[i].result.ecx;
    out.edx = entries[i].result.edx;
  }
  if (::ioctl(vcpu_.get(), kSetCpuid2, cpuid) < 0) {
    return fail(ErrorKind::kHost, "KVM_SET_CPUID2 with the {} entries of CPU model {} failed: {}", entries.size(),
                model.name(), errno_text(errno));
  }
  return {};
}

Result<> KvmBackend::setup_msr_filter() {
  // Default deny: every MSR the CPU model does not place in the vCPU exits to the VMM (time, APIC, PMU,
  // speculation-control and unknown MSRs alike), so no host MSR value ever reaches the guest unrecorded.
  std::vector<uint32_t> owned(CpuModel::cpu_owned_msrs().begin(), CpuModel::cpu_owned_msrs().end());
  std::sort(owned.begin(), owned.end());
  struct Run {
    uint32_t base;
    uint32_t count;
  };
  std::vector<Run> runs;
  for (uint32_t index : owned) {
    if (!runs.empty() && runs.back().base + runs.back().count == index) ++runs.back().count;
    else runs.push_back({index, 1});
  }
  if (runs.size() > KVM_MSR_FILTER_MAX_RANGES) {
    return fail(ErrorKind::kUnsupported, "the CPU model owns MSRs in {} separate ranges; KVM's filter holds {}",
                runs.size(), KVM_MSR_FILTER_MAX_RANGES);
  }
  // One all-ones bitmap serves every range: each range allows exactly its `count` consecutive MSRs.
  std::vector<uint8_t> allow_all(KVM_MSR_FILTER_MAX_BITMAP_SIZE, 0xff);
  kvm_msr_filter filter{};
  filter.flags = KVM_MSR_FILTER_DEFAULT_DENY;
  for (size_t i = 0; i < runs.size(); ++i) {
    filter.ranges[i].flags = KVM_MSR_FILTER_READ | KVM_MSR_FILTER_WRITE;
    filter.ranges[i].base = runs[i].base;
    filter.ranges[i].nmsrs = runs[i].count;
    filter.ranges[i].bitmap = allow_all.data();
  }
  if (::ioctl(vm_.get(), KVM_X86_SET_MSR_FILTER, &filter) < 0) {
    return fail(ErrorKind::kUnsupported, "KVM_X86_SET_MSR_FILTER failed: {}", errno_text(errno));
  }
  return {};
}

Result<> KvmBackend::prepare_kick_signal() {
  // Install a no-op handler only where nobody else handles the signal: its default action would kill us.
  for (int signal : {kKickSignal, pmu_overflow_signal()}) {
    struct sigaction current {};
    ::sigaction(signal, nullptr, &current);
    if (current.sa_handler == SIG_DFL) {
      struct sigaction action {};
      action.sa_handler = ignore_kick_signal;
      sigemptyset(&action.sa_mask);
      ::sigaction(signal, &action, nullptr);
    }
  }
  // The PMU overflow signal follows the same discipline, so an overflow that lands outside KVM_RUN stops
  // the next KVM_RUN instead of being lost (kvm/perf_counter.h).
  sigset_t block;
  sigemptyset(&block);
  sigaddset(&block, kKickSignal);
  sigaddset(&block, pmu_overflow_signal());
  sigset_t old;
  if (int error = ::pthread_sigmask(SIG_BLOCK, &block, &old); error != 0) {
    return fail(ErrorKind::kHost, "blocking the kick signal failed: {}", errno_text(error));
  }
  // Inside KVM_RUN the thread's usual mask applies, minus the kick signal.
  sigset_t during_run = old;
  sigdelset(&during_run, kKickSignal);
  sigdelset(&during_run, pmu_overflow_signal());
  // The kernel's sigset is 8 bytes on x86-64, glibc's sigset_t is larger; KVM insists on the former.
  SignalMask mask{};
  mask.len = 8;
  std::memcpy(mask.sigset, &during_run, 8);
  if (::ioctl(vcpu_.get(), kSetSignalMask, &mask) < 0) {
    return fail(ErrorKind::kHost, "KVM_SET_SIGNAL_MASK failed: {}", errno_text(errno));
  }
  vcpu_thread_.store(::pthread_self());
  vcpu_thread_known_.store(true, std::memory_order_release);
  signal_mask_set_ = true;
  return {};
}

void KvmBackend::kick() {
  // Both are async-signal-safe: a store into the shared kvm_run page and pthread_kill.
  __atomic_store_n(&run_->immediate_exit, 1, __ATOMIC_SEQ_CST);
  if (vcpu_thread_known_.load(std::memory_order_acquire)) ::pthread_kill(vcpu_thread_.load(), kKickSignal);
}

uint64_t KvmBackend::current_rip() {
  if (sync_regs_) return run_->s.regs.regs.rip;
  kvm_regs regs{};
  if (::ioctl(vcpu_.get(), KVM_GET_REGS, &regs) < 0) return 0;
  return regs.rip;
}

void KvmBackend::complete_previous_exit() {
  if (!needs_completion_) return;
  needs_completion_ = false;
  switch (exit_.kind) {
    case ExitKind::kIoIn: {
      auto* data = reinterpret_cast<uint8_t*>(run_) + run_->io.data_offset + size_t(io_.index) * run_->io.size;
      std::memcpy(data, &exit_.value, run_->io.size);
      break;
    }
    case ExitKind::kMmioRead:
      std::memcpy(run_->mmio.data, &exit_.value, std::min<size_t>(run_->mmio.len, sizeof(exit_.value)));
      break;
    case ExitKind::kMsrRead:
      run_->msr.error = exit_.fault ? 1 : 0;
      run_->msr.data = exit_.fault ? 0 : exit_.value;
      break;
    case ExitKind::kMsrWrite:
      run_->msr.error = exit_.fault ? 1 : 0;
      break;
    case ExitKind::kRdtsc:
    case ExitKind::kRdrand:
      kvm_deja::complete(run_->padding, exit_, tsc_aux_);
      break;
    default:
      break;
  }
}

VcpuExit* KvmBackend::finish(ExitKind kind) {
  exit_.kind = kind;
  auto& slot = recent_[exit_serial_++ % kRecentExits];
  uint64_t where = exit_.kind == ExitKind::kMmioRead || exit_.kind == ExitKind::kMmioWrite ? exit_.address
                   : exit_.kind == ExitKind::kMsrRead || exit_.kind == ExitKind::kMsrWrite ? exit_.msr
                                                                                          : exit_.port;
  slot = {kind, exit_.rip, where};
  return &exit_;
}

VcpuExit* KvmBackend::emit_io_element() {
  uint8_t size = run_->io.size;
  exit_ = VcpuExit{};
  exit_.port = run_->io.port;
  exit_.size = size;
  exit_.rip = current_rip();
  if (run_->io.direction == KVM_EXIT_IO_OUT) {
    auto* data = reinterpret_cast<const uint8_t*>(run_) + run_->io.data_offset + size_t(io_.index) * size;
    std::memcpy(&exit_.value, data, size);
    return finish(ExitKind::kIoOut);
  }
  needs_completion_ = true;
  return finish(ExitKind::kIoIn);
}

VcpuExit* KvmBackend::stop_with_diagnostic(ExitKind kind, std::string reason) {
  exit_ = VcpuExit{};
  exit_.rip = current_rip();
  std::string detail = std::move(reason) + "\n";
  if (auto state = get_state()) {
    if (kind == ExitKind::kShutdown && state->rip == 0xfff0 && state->cs.selector == 0xf000) {
      // svm.c shutdown_interception() reinitialises the VMCB before reporting the shutdown.
      detail += "note: KVM on AMD (SVM) resets the vCPU on a triple fault, so these are reset-state registers; "
                "the last exits below locate the fault (or rerun with --backend interp for the faulting state)\n";
    }
    detail += format_cpu_state(*state);
  } else {
    detail += "(registers unavailable: " + state.error().message + ")\n";
  }
  uint64_t shown = std::min<uint64_t>(exit_serial_, kRecentExits);
  detail += fmt::format("last {} exits, oldest first:\n", shown);
  for (uint64_t i = exit_serial_ - shown; i < exit_serial_; ++i) {
    const auto& e = recent_[i % kRecentExits];
    detail += fmt::format("  #{} {} rip={:#x} at={:#x}\n", i, exit_kind_name(e.kind), e.rip, e.where);
  }
  exit_.detail = std::move(detail);
  return finish(kind);
}

Result<VcpuExit*> KvmBackend::run() {
  if (!signal_mask_set_) {
    if (auto ok = prepare_kick_signal(); !ok) return std::unexpected(ok.error());
  }
  complete_previous_exit();
  if (io_.active) {
    if (++io_.index < io_.count) return emit_io_element();
    io_.active = false;
  }

  const bool single_step = (guest_debug_.control & KVM_GUESTDBG_SINGLESTEP) != 0;
  if (single_step && std::exchange(write_completed_at_exit_, false)) step_owed_ = true;
  // Not after a kick: a kick lands where host time says, and stepping must go on after it exactly as it would have
  // without it (a replay has no kick there).
  bool arm_step = single_step && (exit_.kind != ExitKind::kKicked || state_set_since_exit_);
  for (;;) {
    if (std::exchange(step_owed_, false)) {
      exit_ = VcpuExit{};
      exit_.rip = current_rip();
      return finish(ExitKind::kDebug);
    }
    if (std::exchange(arm_step, false)) {
      // KVM sets the trap flag behind a single step only while RIP is where KVM_SET_GUEST_DEBUG found it: an
      // instruction KVM emulates (an MMIO access, a CR access without decode assists) or a KVM_SET_REGS writes
      // RFLAGS back without it, and the vCPU then runs on unstepped to its next exit. Armed here before every
      // run, each run is one step from wherever the vCPU stands, as on the software CPU.
      if (::ioctl(vcpu_.get(), KVM_SET_GUEST_DEBUG, &guest_debug_) < 0) {
        return fail(ErrorKind::kHost, "KVM_SET_GUEST_DEBUG (single step) failed: {}", errno_text(errno));
      }
    }
    auto exit = run_once();
    // PAUSE exits are enabled for the whole VM: a vCPU not asked for them goes on past the (skipped) PAUSE.
    if (!exit || (*exit)->kind != ExitKind::kPause || pause_exits_) return exit;
  }
}

Result<VcpuExit*> KvmBackend::run_once() {
  int result = ::ioctl(vcpu_.get(), KVM_RUN, 0);
  int error = errno;
  injected_since_exit_ = false;
  state_set_since_exit_ = false;
  halted_ = false;
  write_completed_at_exit_ = false;
  if (result < 0) {
    if (error == EINTR || error == EAGAIN) {
      __atomic_store_n(&run_->immediate_exit, 0, __ATOMIC_SEQ_CST);
      // Drop a kick or overflow signal still pending from the same stop, or the next run() would stop at once
      // again. Both are kKicked: the caller reads the progress counter to tell a reached target from a kick.
      sigset_t stop_signals;
      sigemptyset(&stop_signals);
      sigaddset(&stop_signals, kKickSignal);
      sigaddset(&stop_signals, pmu_overflow_signal());
      timespec zero{};
      while (::sigtimedwait(&stop_signals, nullptr, &zero) > 0) {
      }
      exit_ = VcpuExit{};
      exit_.rip = current_rip();
      return finish(ExitKind::kKicked);
    }
    return fail(ErrorKind::kHost, "KVM_RUN failed: {}", errno_text(error));
  }
  return translate_exit();
}

Result<VcpuExit*> KvmBackend::translate_exit() {
  switch (run_->exit_reason) {
    case KVM_EXIT_IO:
      io_ = {.active = run_->io.count > 1, .index = 0, .count = run_->io.count};
      return emit_io_element();
    case KVM_EXIT_MMIO:
      exit_ = VcpuExit{};
      exit_.address = run_->mmio.phys_addr;
      exit_.size = static_cast<uint8_t>(run_->mmio.len);
      exit_.rip = current_rip();
      if (run_->mmio.is_write) {
        std::memcpy(&exit_.value, run_->mmio.data, std::min<size_t>(run_->mmio.len, sizeof(exit_.value)));
        write_completed_at_exit_ = true;
        return finish(ExitKind::kMmioWrite);
      }
      needs_completion_ = true;
      return finish(ExitKind::kMmioRead);
    case KVM_EXIT_X86_RDMSR:
    case KVM_EXIT_X86_WRMSR: {
      bool read = run_->exit_reason == KVM_EXIT_X86_RDMSR;
      exit_ = VcpuExit{};
      exit_.msr = run_->msr.index;
      exit_.value = read ? 0 : run_->msr.data;
      exit_.rip = current_rip();
      needs_completion_ = true;
      return finish(read ? ExitKind::kMsrRead : ExitKind::kMsrWrite);
    }
    case KVM_EXIT_DEJA:
      exit_ = VcpuExit{};
      exit_.rip = current_rip();
      if (!kvm_deja::translate(run_->padding, exit_)) return stop_with_diagnostic(ExitKind::kFault, exit_.detail);
      needs_completion_ = exit_.kind != ExitKind::kPause;  // (the module skipped the PAUSE: nothing to answer)
      step_owed_ = kvm_deja::pause_ended_step(run_->padding);
      return finish(exit_.kind);
    case KVM_EXIT_HLT:
      exit_ = VcpuExit{};
      // KVM has already stepped past the one-byte HLT; the exit names the instruction itself.
      exit_.rip = current_rip() - 1;
      halted_ = true;
      return finish(ExitKind::kHlt);
    case KVM_EXIT_IRQ_WINDOW_OPEN:
      exit_ = VcpuExit{};
      exit_.rip = current_rip();
      return finish(ExitKind::kInterruptWindow);
    case KVM_EXIT_INTR:
      exit_ = VcpuExit{};
      exit_.rip = current_rip();
      return finish(ExitKind::kKicked);
    case KVM_EXIT_DEBUG:
      exit_ = VcpuExit{};
      exit_.rip = current_rip();
      return finish(ExitKind::kDebug);
    case KVM_EXIT_SHUTDOWN:
      return stop_with_diagnostic(ExitKind::kShutdown, "triple fault (KVM_EXIT_SHUTDOWN): the guest cannot continue");
    case KVM_EXIT_FAIL_ENTRY:
      return stop_with_diagnostic(
          ExitKind::kFault,
          fmt::format("VM entry failed (KVM_EXIT_FAIL_ENTRY): hardware entry failure reason {:#x} on cpu {}; the "
                      "loaded CPU state is invalid for this host",
                      run_->fail_entry.hardware_entry_failure_reason, run_->fail_entry.cpu));
    case KVM_EXIT_INTERNAL_ERROR: {
      std::string data;
      for (uint32_t i = 0; i < std::min<uint32_t>(run_->internal.ndata, 16); ++i) {
        data += fmt::format(" {:#x}", run_->internal.data[i]);
      }
      static constexpr const char* kSuberrors[] = {"?", "emulation failure", "simultaneous exceptions",
                                                   "delivery event failure", "unexpected exit reason"};
      uint32_t sub = run_->internal.suberror;
      return stop_with_diagnostic(ExitKind::kFault,
                                  fmt::format("KVM internal error (KVM_EXIT_INTERNAL_ERROR): suberror {} ({}), data:{}",
                                              sub, sub < std::size(kSuberrors) ? kSuberrors[sub] : "unknown", data));
    }
    default:
      return stop_with_diagnostic(ExitKind::kFault,
                                  fmt::format("unexpected KVM exit reason {} (see <linux/kvm.h> KVM_EXIT_*)",
                                              run_->exit_reason));
  }
}

Result<CpuState> KvmBackend::get_state() {
  CpuState state;
  kvm_regs regs{};
  if (::ioctl(vcpu_.get(), KVM_GET_REGS, &regs) < 0) {
    return fail(ErrorKind::kHost, "KVM_GET_REGS failed: {}", errno_text(errno));
  }
  state.gpr = {regs.rax, regs.rcx, regs.rdx, regs.rbx, regs.rsp, regs.rbp, regs.rsi, regs.rdi,
               regs.r8,  regs.r9,  regs.r10, regs.r11, regs.r12, regs.r13, regs.r14, regs.r15};
  state.rip = regs.rip;
  state.rflags = regs.rflags;

  kvm_sregs sregs{};
  if (::ioctl(vcpu_.get(), KVM_GET_SREGS, &sregs) < 0) {
    return fail(ErrorKind::kHost, "KVM_GET_SREGS failed: {}", errno_text(errno));
  }
  state.cs = from_kvm(sregs.cs);
  state.ds = from_kvm(sregs.ds);
  state.es = from_kvm(sregs.es);
  state.fs = from_kvm(sregs.fs);
  state.gs = from_kvm(sregs.gs);
  state.ss = from_kvm(sregs.ss);
  state.tr = from_kvm(sregs.tr);
  state.ldt = from_kvm(sregs.ldt);
  state.gdt = {sregs.gdt.base, sregs.gdt.limit};
  state.idt = {sregs.idt.base, sregs.idt.limit};
  state.cr0 = sregs.cr0;
  state.cr2 = sregs.cr2;
  state.cr3 = sregs.cr3;
  state.cr4 = sregs.cr4;
  state.cr8 = sregs.cr8;
  state.efer = sregs.efer;
  state.xcr0 = 1;  // without KVM_CAP_XCRS the guest cannot have changed it (x87 alone)
  if (xcrs_) {
    kvm_xcrs xcrs{};
    if (::ioctl(vcpu_.get(), KVM_GET_XCRS, &xcrs) < 0) {
      return fail(ErrorKind::kHost, "KVM_GET_XCRS failed: {}", errno_text(errno));
    }
    for (uint32_t i = 0; i < std::min<uint32_t>(xcrs.nr_xcrs, KVM_MAX_XCRS); ++i) {
      if (xcrs.xcrs[i].xcr == 0) state.xcr0 = xcrs.xcrs[i].value;
    }
  }

  MsrBuffer msrs{};
  msrs.nmsrs = std::size(kStateMsrs);
  for (size_t i = 0; i < std::size(kStateMsrs); ++i) msrs.entries[i].index = kStateMsrs[i];
  int got = ::ioctl(vcpu_.get(), kGetMsrs, &msrs);
  if (got != static_cast<int>(std::size(kStateMsrs))) {
    return fail(ErrorKind::kHost, "KVM_GET_MSRS read {} of {} MSRs (stopped at {:#x}): {}", got,
                std::size(kStateMsrs), got >= 0 && got < int(std::size(kStateMsrs)) ? kStateMsrs[got] : 0,
                errno_text(errno));
  }
  for (size_t i = 0; i < std::size(kStateMsrs); ++i) *state_msr_field(state.msrs, kStateMsrs[i]) = msrs.entries[i].data;
  state.msrs.tsc_aux = tsc_aux_;

  if (auto ok = get_fxsave(state.fxsave, state.ymmh, state.xinuse); !ok) return std::unexpected(ok.error());

  kvm_vcpu_events events{};
  if (::ioctl(vcpu_.get(), KVM_GET_VCPU_EVENTS, &events) < 0) {
    return fail(ErrorKind::kHost, "KVM_GET_VCPU_EVENTS failed: {}", errno_text(errno));
  }
  state.interrupt_shadow = events.interrupt.shadow != 0;
  state.halted = halted_;
  return state;
}

// Makes a loader's state acceptable to VM entry checks (SDM Vol. 3, 26.3.1.2) on both VMX and SVM:
// absent data segments are marked unusable, TR is a busy TSS, and EFER.LMA follows LME && PG.
CpuState normalized(CpuState state) {
  bool protected_mode = (state.cr0 & cr0::kPe) != 0;
  if (protected_mode) {
    for (SegmentReg* seg : {&state.ds, &state.es, &state.fs, &state.gs, &state.ss}) {
      if (!seg->present) seg->unusable = true;
    }
    if (!state.ldt.present || state.ldt.selector == 0) {
      state.ldt.unusable = true;
      state.ldt.present = false;
    }
    if (!state.tr.present || (state.tr.type != 3 && state.tr.type != 11)) {
      state.tr.present = true;
      state.tr.unusable = false;
      state.tr.s = false;
      state.tr.type = 11;
      if (state.tr.limit == 0) state.tr.limit = 0x67;
    }
  }
  if ((state.efer & efer::kLme) && (state.cr0 & cr0::kPg)) state.efer |= efer::kLma;
  state.cr0 |= cr0::kEt;  // hardwired to 1 since the i486
  return state;
}

Result<> KvmBackend::set_state(const CpuState& requested) {
  CpuState state = normalized(requested);
  kvm_sregs sregs{};
  // Start from KVM's own sregs so that apic_base and the pending-interrupt bitmap stay as KVM has them.
  if (::ioctl(vcpu_.get(), KVM_GET_SREGS, &sregs) < 0) {
    return fail(ErrorKind::kHost, "KVM_GET_SREGS failed: {}", errno_text(errno));
  }
  sregs.cs = to_kvm(state.cs);
  sregs.ds = to_kvm(state.ds);
  sregs.es = to_kvm(state.es);
  sregs.fs = to_kvm(state.fs);
  sregs.gs = to_kvm(state.gs);
  sregs.ss = to_kvm(state.ss);
  sregs.tr = to_kvm(state.tr);
  sregs.ldt = to_kvm(state.ldt);
  sregs.gdt.base = state.gdt.base;
  sregs.gdt.limit = state.gdt.limit;
  sregs.idt.base = state.idt.base;
  sregs.idt.limit = state.idt.limit;
  sregs.cr0 = state.cr0;
  sregs.cr2 = state.cr2;
  sregs.cr3 = state.cr3;
  sregs.cr4 = state.cr4;
  sregs.cr8 = state.cr8;
  sregs.efer = state.efer;
  if (::ioctl(vcpu_.get(), KVM_SET_SREGS, &sregs) < 0) {
    return fail(ErrorKind::kGuest,
                "KVM_SET_SREGS rejected the CPU state ({}; cr0={:#x} cr4={:#x} efer={:#x}): the control registers are "
                "inconsistent",
                errno_text(errno), state.cr0, state.cr4, state.efer);
  }

  kvm_regs regs{};
  const auto& g = state.gpr;
  regs.rax = g[kRax], regs.rcx = g[kRcx], regs.rdx = g[kRdx], regs.rbx = g[kRbx];
  regs.rsp = g[kRsp], regs.rbp = g[kRbp], regs.rsi = g[kRsi], regs.rdi = g[kRdi];
  regs.r8 = g[kR8], regs.r9 = g[kR9], regs.r10 = g[kR10], regs.r11 = g[kR11];
  regs.r12 = g[kR12], regs.r13 = g[kR13], regs.r14 = g[kR14], regs.r15 = g[kR15];
  regs.rip = state.rip;
  regs.rflags = state.rflags | 0x2;  // bit 1 is reserved as 1
  if (::ioctl(vcpu_.get(), KVM_SET_REGS, &regs) < 0) {
    return fail(ErrorKind::kHost, "KVM_SET_REGS failed: {}", errno_text(errno));
  }

  MsrBuffer msrs{};
  msrs.nmsrs = std::size(kStateMsrs);
  for (size_t i = 0; i < std::size(kStateMsrs); ++i) {
    msrs.entries[i].index = kStateMsrs[i];
    msrs.entries[i].data = *state_msr_field(state.msrs, kStateMsrs[i]);
  }
  int set = ::ioctl(vcpu_.get(), kSetMsrs, &msrs);
  if (set != static_cast<int>(std::size(kStateMsrs))) {
    uint32_t bad = set >= 0 && set < int(std::size(kStateMsrs)) ? kStateMsrs[set] : 0;
    return fail(ErrorKind::kGuest, "KVM refused MSR {:#x} = {:#x} from the CPU state", bad,
                set >= 0 && set < int(std::size(kStateMsrs)) ? msrs.entries[set].data : 0);
  }
  tsc_aux_ = state.msrs.tsc_aux;
  if (xcrs_) {
    // XCR0 as the guest's XSETBV left it (a checkpoint restore must bring back its XSAVE feature set).
    kvm_xcrs xcrs{};
    xcrs.nr_xcrs = 1;
    xcrs.xcrs[0].xcr = 0;
    xcrs.xcrs[0].value = state.xcr0 == 0 ? 1 : state.xcr0;
    if (::ioctl(vcpu_.get(), KVM_SET_XCRS, &xcrs) < 0) {
      return fail(ErrorKind::kGuest, "KVM_SET_XCRS refused XCR0 = {:#x} for CPU model state: {}", state.xcr0,
                  errno_text(errno));
    }
  } else if (state.xcr0 > 1) {
    return fail(ErrorKind::kUnsupported, "XCR0 = {:#x} cannot be loaded: this host's KVM lacks KVM_CAP_XCRS",
                state.xcr0);
  }

  if (auto ok = set_fxsave(state.fxsave, state.ymmh, state.xinuse); !ok) return ok;
  fxsave_shadow_ = state.fxsave;

  kvm_vcpu_events events{};
  if (::ioctl(vcpu_.get(), KVM_GET_VCPU_EVENTS, &events) < 0) {
    return fail(ErrorKind::kHost, "KVM_GET_VCPU_EVENTS failed: {}", errno_text(errno));
  }
  events.interrupt.shadow = state.interrupt_shadow ? KVM_X86_SHADOW_INT_STI : 0;
  events.flags = KVM_VCPUEVENT_VALID_SHADOW;
  if (::ioctl(vcpu_.get(), KVM_SET_VCPU_EVENTS, &events) < 0) {
    return fail(ErrorKind::kHost, "KVM_SET_VCPU_EVENTS failed: {}", errno_text(errno));
  }
  halted_ = state.halted;
  state_set_since_exit_ = true;
  io_.active = false;
  step_owed_ = false;
  write_completed_at_exit_ = false;
  needs_completion_ = false;
  return {};
}

// x87/SSE state in FXSAVE layout (SDM Vol. 1, 10.5.1, 64-bit format). XSAVE is preferred: KVM_SET_FPU leaves
// XSTATE_BV alone, so SSE registers set through it can be dropped at the next XRSTOR, and KVM_GET_FPU does not
// report MXCSR. Bytes that are not architectural state (MXCSR_MASK, the reserved tail) read back as last set.
Result<> KvmBackend::get_fxsave(std::array<uint8_t, 512>& fx, std::array<uint8_t, 256>& ymmh, uint64_t& xinuse) {
  fx = fxsave_shadow_;
  ymmh = {};
  xinuse = xcr0::kX87 | xcr0::kSse;
  if (xsave_size_ != 0) {
    std::vector<uint8_t> area(xsave_size_, 0);
    if (::ioctl(vcpu_.get(), xsave2_ ? kGetXsave2 : kGetXsave, area.data()) < 0) {
      return fail(ErrorKind::kHost, "KVM_GET_XSAVE failed: {}", errno_text(errno));
    }
    std::memcpy(&fx[0], area.data(), 28);
    std::memcpy(&fx[32], area.data() + 32, 416 - 32);
    // The AVX component in KVM's (standard-format) area: its initial configuration, zeros, where not in use.
    uint64_t xstate_bv = 0;
    std::memcpy(&xstate_bv, area.data() + kXsaveHeader, 8);
    if ((xstate_bv & xcr0::kAvx) && area.size() >= kXsaveAvx + ymmh.size())
      std::memcpy(ymmh.data(), area.data() + kXsaveAvx, ymmh.size());
    // KVM saves the guest's state with the init optimization: XSTATE_BV is the processor's XINUSE.
    xinuse = xstate_bv & (xcr0::kX87 | xcr0::kSse | xcr0::kAvx);
    return {};
  }
  kvm_fpu fpu{};
  if (::ioctl(vcpu_.get(), KVM_GET_FPU, &fpu) < 0) {
    return fail(ErrorKind::kHost, "KVM_GET_FPU failed: {}", errno_text(errno));
  }
  std::memcpy(&fx[0], &fpu.fcw, 2);
  std::memcpy(&fx[2], &fpu.fsw, 2);
  fx[4] = fpu.ftwx;
  std::memcpy(&fx[6], &fpu.last_opcode, 2);
  std::memcpy(&fx[8], &fpu.last_ip, 8);
  std::memcpy(&fx[16], &fpu.last_dp, 8);
  std::memcpy(&fx[32], fpu.fpr, sizeof(fpu.fpr));
  std::memcpy(&fx[160], fpu.xmm, sizeof(fpu.xmm));
  return {};
}

Result<> KvmBackend::set_fxsave(const std::array<uint8_t, 512>& requested, const std::array<uint8_t, 256>& ymmh,
                                uint64_t xinuse) {
  const bool avx_state = std::any_of(ymmh.begin(), ymmh.end(), [](uint8_t b) { return b != 0; });
  std::array<uint8_t, 512> fx = requested;
  // An all-zero area means "reset state": FCW 0x37f and MXCSR 0x1f80, as after FNINIT / power-on.
  if (std::all_of(fx.begin(), fx.end(), [](uint8_t b) { return b == 0; })) {
    const uint16_t fcw = 0x37f;
    const uint32_t mxcsr = 0x1f80;
    std::memcpy(&fx[0], &fcw, 2);
    std::memcpy(&fx[24], &mxcsr, 4);
  }
  uint32_t mxcsr = 0;
  std::memcpy(&mxcsr, &fx[24], 4);
  if (xsave_size_ != 0) {
    std::vector<uint8_t> area(xsave_size_, 0);
    if (::ioctl(vcpu_.get(), xsave2_ ? kGetXsave2 : kGetXsave, area.data()) < 0) {
      return fail(ErrorKind::kHost, "KVM_GET_XSAVE failed: {}", errno_text(errno));
    }
    std::memcpy(area.data(), &fx[0], 28);
    std::memcpy(area.data() + 32, &fx[32], 416 - 32);
    // XSTATE_BV (SDM Vol. 1, 13.4.2), which KVM's XRSTOR makes the vCPU's XINUSE: the state's XINUSE, plus every
    // component that is not in its initial configuration (XRSTOR would load that instead of the data): x87 unless
    // FCW is 037FH and the rest zero, SSE unless the XMM registers are zero and MXCSR is 1F80H, AVX unless the
    // upper halves are zero (which a model without AVX can load too).
    uint64_t xstate_bv = 0;
    std::memcpy(&xstate_bv, area.data() + kXsaveHeader, 8);
    xstate_bv &= ~(xcr0::kX87 | xcr0::kSse | xcr0::kAvx);
    xstate_bv |= xinuse & (xcr0::kX87 | xcr0::kSse);
    auto zero = [&](size_t from, size_t to) { return std::all_of(&fx[from], &fx[to], [](uint8_t b) { return b == 0; }); };
    const uint16_t fcw = uint16_t(fx[0] | fx[1] << 8);
    if (fcw != 0x37f || !zero(2, 24) || !zero(32, 160)) xstate_bv |= xcr0::kX87;
    if (mxcsr != 0x1f80 || !zero(160, 416)) xstate_bv |= xcr0::kSse;
    if (area.size() >= kXsaveAvx + ymmh.size()) {
      std::memcpy(area.data() + kXsaveAvx, ymmh.data(), ymmh.size());
      if (avx_state || (xinuse & xcr0::kAvx)) xstate_bv |= xcr0::kAvx;
    }
    std::memcpy(area.data() + kXsaveHeader, &xstate_bv, 8);
    if (::ioctl(vcpu_.get(), kSetXsave, area.data()) < 0) {
      return fail(ErrorKind::kGuest, "KVM_SET_XSAVE rejected the x87/SSE state (mxcsr={:#x}): {}", mxcsr,
                  errno_text(errno));
    }
    return {};
  }
  if (avx_state) {
    return fail(ErrorKind::kUnsupported, "this host's KVM lacks KVM_CAP_XSAVE: the YMM registers cannot be loaded");
  }
  kvm_fpu fpu{};
  std::memcpy(&fpu.fcw, &fx[0], 2);
  std::memcpy(&fpu.fsw, &fx[2], 2);
  fpu.ftwx = fx[4];
  std::memcpy(&fpu.last_opcode, &fx[6], 2);
  std::memcpy(&fpu.last_ip, &fx[8], 8);
  std::memcpy(&fpu.last_dp, &fx[16], 8);
  fpu.mxcsr = mxcsr;
  std::memcpy(fpu.fpr, &fx[32], sizeof(fpu.fpr));
  std::memcpy(fpu.xmm, &fx[160], sizeof(fpu.xmm));
  if (::ioctl(vcpu_.get(), KVM_SET_FPU, &fpu) < 0) {
    return fail(ErrorKind::kGuest, "KVM_SET_FPU rejected the x87/SSE state (mxcsr={:#x}): {}", mxcsr,
                errno_text(errno));
  }
  return {};
}

bool KvmBackend::can_inject_interrupt() {
  if (injected_since_exit_) return false;
  // An MSR access answered with a fault completes as #GP on the next KVM_RUN. KVM injects that exception
  // and then clears its interrupt queue, so an interrupt queued now with KVM_INTERRUPT would be lost (and
  // the 8259 would keep it in service forever): take it after the #GP, as the SDM orders them.
  if (needs_completion_ && exit_.fault && (exit_.kind == ExitKind::kMsrRead || exit_.kind == ExitKind::kMsrWrite)) {
    return false;
  }
  if (!state_set_since_exit_) return run_->ready_for_interrupt_injection && run_->if_flag;
  // kvm_run's flags describe the last exit, not a state loaded since: ask the vCPU itself.
  kvm_regs regs{};
  kvm_vcpu_events events{};
  if (::ioctl(vcpu_.get(), KVM_GET_REGS, &regs) < 0 || ::ioctl(vcpu_.get(), KVM_GET_VCPU_EVENTS, &events) < 0) {
    return false;
  }
  return (regs.rflags & rflags::kIf) && events.interrupt.shadow == 0 && !events.interrupt.injected &&
         !events.exception.injected && !events.nmi.injected;
}

Result<> KvmBackend::inject_interrupt(uint8_t vector) {
  kvm_interrupt interrupt{};
  interrupt.irq = vector;
  if (::ioctl(vcpu_.get(), KVM_INTERRUPT, &interrupt) < 0) {
    return fail(ErrorKind::kHost, "KVM_INTERRUPT (vector {:#x}) failed: {} (was can_inject_interrupt() true?)",
                vector, errno_text(errno));
  }
  injected_since_exit_ = true;
  halted_ = false;
  return {};
}

// KVM_NMI queues an NMI when there is no in-kernel irqchip; KVM delivers it when NMIs are not blocked.
Result<> KvmBackend::inject_nmi() {
  if (::ioctl(vcpu_.get(), KVM_NMI, 0) < 0) return fail(ErrorKind::kHost, "KVM_NMI failed: {}", errno_text(errno));
  halted_ = false;
  return {};
}

Result<> KvmBackend::set_pause_exits(bool on) {
  if (on && !(deja_.mask & KVM_DEJA_PAUSE)) {
    return fail(ErrorKind::kUnsupported, "this host's KVM cannot stop a vCPU at PAUSE: {}", deja_.pause_why_not);
  }
  pause_exits_ = on;
  return {};
}

Result<> KvmBackend::set_debug(const DebugControl& control) {
  if (!control.watchpoints.empty() || !control.breakpoints.empty() || control.stop_at_step) {
    return fail(ErrorKind::kUnsupported,
                "the KVM backend has no data watchpoints, extra breakpoints or step count (debug with --backend interp)");
  }
  if (!control.single_step) step_owed_ = false;  // (a step owed after a PAUSE is no longer wanted)
  // KVM_SET_GUEST_DEBUG takes the complete debug configuration each time; clearing it is control = 0.
  kvm_guest_debug debug{};
  if (control.single_step || control.breakpoint) {
    debug.control = KVM_GUESTDBG_ENABLE;
    // KVM sets RFLAGS.TF behind the guest's back (hidden from KVM_GET_REGS): a trap after each instruction,
    // and after each iteration of a REP string instruction (SDM Vol. 3, 18.3.1.4).
    if (control.single_step) debug.control |= KVM_GUESTDBG_SINGLESTEP;
    if (control.breakpoint) {
      debug.control |= KVM_GUESTDBG_USE_HW_BP;
      debug.arch.debugreg[0] = *control.breakpoint;
      // DR7 (SDM Vol. 3, 18.2.4): L0 enables DR0; R/W0 = 00 and LEN0 = 00 make it an instruction breakpoint,
      // a fault taken before the instruction executes. Bit 10 reads as 1.
      debug.arch.debugreg[7] = (uint64_t{1} << 0) | (uint64_t{1} << 10);
    }
  }
  if (::ioctl(vcpu_.get(), KVM_SET_GUEST_DEBUG, &debug) < 0) {
    return fail(ErrorKind::kHost, "KVM_SET_GUEST_DEBUG (single_step={}, breakpoint={}) failed: {}",
                control.single_step, control.breakpoint ? fmt::format("{:#x}", *control.breakpoint) : "none",
                errno_text(errno));
  }
  guest_debug_ = debug;
  return {};
}

void KvmBackend::request_interrupt_window(bool enable) { run_->request_interrupt_window = enable ? 1 : 0; }

// Checkpoints: slot 0 re-registered with KVM_MEM_LOG_DIRTY_PAGES; from then on KVM write-protects RAM
// and KVM_GET_DIRTY_LOG returns (and clears) the pages the guest wrote since the previous call.
Result<> KvmBackend::start_dirty_log() {
  if (dirty_log_) return {};
  kvm_userspace_memory_region region{};
  region.slot = 0;
  region.flags = KVM_MEM_LOG_DIRTY_PAGES;
  region.memory_size = ram_->size();
  region.userspace_addr = reinterpret_cast<uint64_t>(ram_->host_base());
  if (::ioctl(vm_.get(), KVM_SET_USER_MEMORY_REGION, &region) < 0) {
    return fail(ErrorKind::kHost, "enabling KVM's dirty log on guest RAM (KVM_MEM_LOG_DIRTY_PAGES) failed: {}",
                errno_text(errno));
  }
  dirty_log_ = true;
  return {};
}

Result<> KvmBackend::sync_dirty_log() {
  if (!dirty_log_) return fail(ErrorKind::kInvalidArgument, "KVM dirty log read before start_dirty_log()");
  std::span<uint64_t> bits = ram_->dirty_bitmap();
  std::vector<uint64_t> log(bits.size(), 0);
  kvm_dirty_log request{};
  request.slot = 0;
  request.dirty_bitmap = log.data();
  if (::ioctl(vm_.get(), KVM_GET_DIRTY_LOG, &request) < 0) {
    return fail(ErrorKind::kHost, "KVM_GET_DIRTY_LOG failed: {}", errno_text(errno));
  }
  for (size_t i = 0; i < bits.size(); ++i) bits[i] |= log[i];
  return {};
}

}  // namespace

Result<std::vector<std::unique_ptr<Backend>>> make_kvm_backends(GuestMemory& memory,
                                                                std::span<const CpuModel* const> models,
                                                                const KvmOptions& options) {
  std::vector<std::unique_ptr<Backend>> vcpus;
  const KvmBackend* first = nullptr;
  for (uint32_t i = 0; i < models.size(); ++i) {
    auto vcpu = KvmBackend::create(first, memory, *models[i], i, uint32_t(models.size()), options);
    if (!vcpu) return std::unexpected(vcpu.error());
    if (i == 0) first = vcpu->get();
    vcpus.push_back(std::move(*vcpu));
  }
  return vcpus;
}

Result<std::unique_ptr<Backend>> make_kvm_backend(GuestMemory& memory, const CpuModel& model,
                                                  const KvmOptions& options) {
  const CpuModel* models[] = {&model};
  auto vcpus = make_kvm_backends(memory, models, options);
  if (!vcpus) return std::unexpected(vcpus.error());
  return std::move(vcpus->front());
}

}  // namespace deja
