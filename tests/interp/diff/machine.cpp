// Runs one instruction sequence natively (in this process, through an asm trampoline) or under InterpBackend, from the same register file.
#include "tests/interp/diff/machine.h"

#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "core/cpu_model.h"

// The trampoline: enter loads every register from the RegisterFile at 0x600000 and jumps to the
// sequence; the sequence's tail jumps to exit, which stores them back. Absolute addresses keep the
// sequence free to use any register (RSP included) without the trampoline needing one.
asm(R"(
  .text
  .globl deja_diff_enter
  .type deja_diff_enter, @function
deja_diff_enter:
  push %rbx
  push %rbp
  push %r12
  push %r13
  push %r14
  push %r15
  mov %rsp, 0x600090
  fxrstor64 0x6001b0
  ldmxcsr 0x600088
  movdqu 0x6000b0, %xmm0
  movdqu 0x6000c0, %xmm1
  movdqu 0x6000d0, %xmm2
  movdqu 0x6000e0, %xmm3
  movdqu 0x6000f0, %xmm4
  movdqu 0x600100, %xmm5
  movdqu 0x600110, %xmm6
  movdqu 0x600120, %xmm7
  movdqu 0x600130, %xmm8
  movdqu 0x600140, %xmm9
  movdqu 0x600150, %xmm10
  movdqu 0x600160, %xmm11
  movdqu 0x600170, %xmm12
  movdqu 0x600180, %xmm13
  movdqu 0x600190, %xmm14
  movdqu 0x6001a0, %xmm15
  testb $1, 0x6003d0
  jz 1f
  vinsertf128 $1, 0x6003e0, %ymm0, %ymm0
  vinsertf128 $1, 0x6003f0, %ymm1, %ymm1
  vinsertf128 $1, 0x600400, %ymm2, %ymm2
  vinsertf128 $1, 0x600410, %ymm3, %ymm3
  vinsertf128 $1, 0x600420, %ymm4, %ymm4
  vinsertf128 $1, 0x600430, %ymm5, %ymm5
  vinsertf128 $1, 0x600440, %ymm6, %ymm6
  vinsertf128 $1, 0x600450, %ymm7, %ymm7
  vinsertf128 $1, 0x600460, %ymm8, %ymm8
  vinsertf128 $1, 0x600470, %ymm9, %ymm9
  vinsertf128 $1, 0x600480, %ymm10, %ymm10
  vinsertf128 $1, 0x600490, %ymm11, %ymm11
  vinsertf128 $1, 0x6004a0, %ymm12, %ymm12
  vinsertf128 $1, 0x6004b0, %ymm13, %ymm13
  vinsertf128 $1, 0x6004c0, %ymm14, %ymm14
  vinsertf128 $1, 0x6004d0, %ymm15, %ymm15
1:
  mov $0x600ff0, %rsp
  pushq 0x600080
  popfq
  mov 0x600000, %rax
  mov 0x600008, %rcx
  mov 0x600010, %rdx
  mov 0x600018, %rbx
  mov 0x600028, %rbp
  mov 0x600030, %rsi
  mov 0x600038, %rdi
  mov 0x600040, %r8
  mov 0x600048, %r9
  mov 0x600050, %r10
  mov 0x600058, %r11
  mov 0x600060, %r12
  mov 0x600068, %r13
  mov 0x600070, %r14
  mov 0x600078, %r15
  mov 0x600020, %rsp
  jmp *0x600098

  .globl deja_diff_exit
  .type deja_diff_exit, @function
deja_diff_exit:
  mov %rax, 0x600000
  mov %rcx, 0x600008
  mov %rdx, 0x600010
  mov %rbx, 0x600018
  mov %rsp, 0x600020
  mov %rbp, 0x600028
  mov %rsi, 0x600030
  mov %rdi, 0x600038
  mov %r8, 0x600040
  mov %r9, 0x600048
  mov %r10, 0x600050
  mov %r11, 0x600058
  mov %r12, 0x600060
  mov %r13, 0x600068
  mov %r14, 0x600070
  mov %r15, 0x600078
  mov $0x600ff0, %rsp
  pushfq
  popq 0x600080
  stmxcsr 0x600088
  movdqu %xmm0, 0x6000b0
  movdqu %xmm1, 0x6000c0
  movdqu %xmm2, 0x6000d0
  movdqu %xmm3, 0x6000e0
  movdqu %xmm4, 0x6000f0
  movdqu %xmm5, 0x600100
  movdqu %xmm6, 0x600110
  movdqu %xmm7, 0x600120
  movdqu %xmm8, 0x600130
  movdqu %xmm9, 0x600140
  movdqu %xmm10, 0x600150
  movdqu %xmm11, 0x600160
  movdqu %xmm12, 0x600170
  movdqu %xmm13, 0x600180
  movdqu %xmm14, 0x600190
  movdqu %xmm15, 0x6001a0
  testb $1, 0x6003d0
  jz 1f
  vextractf128 $1, %ymm0, 0x6003e0
  vextractf128 $1, %ymm1, 0x6003f0
  vextractf128 $1, %ymm2, 0x600400
  vextractf128 $1, %ymm3, 0x600410
  vextractf128 $1, %ymm4, 0x600420
  vextractf128 $1, %ymm5, 0x600430
  vextractf128 $1, %ymm6, 0x600440
  vextractf128 $1, %ymm7, 0x600450
  vextractf128 $1, %ymm8, 0x600460
  vextractf128 $1, %ymm9, 0x600470
  vextractf128 $1, %ymm10, 0x600480
  vextractf128 $1, %ymm11, 0x600490
  vextractf128 $1, %ymm12, 0x6004a0
  vextractf128 $1, %ymm13, 0x6004b0
  vextractf128 $1, %ymm14, 0x6004c0
  vextractf128 $1, %ymm15, 0x6004d0
  vzeroupper
1:
  fxsave64 0x6001b0
  fnstenv 0x6003b0
  fninit
  cld
  pushq $0x1f80
  ldmxcsr (%rsp)
  mov 0x600090, %rsp
  pop %r15
  pop %r14
  pop %r13
  pop %r12
  pop %rbp
  pop %rbx
  ret
)");

extern "C" void deja_diff_enter();
extern "C" void deja_diff_exit();

namespace deja::difftest {

const char* ending_name(Ending ending) {
  switch (ending) {
    case Ending::kCompleted: return "completed";
    case Ending::kDivideError: return "#DE";
    case Ending::kSimdFault: return "#XM/#MF";
    case Ending::kInvalidOpcode: return "#UD";
    case Ending::kMemoryFault: return "#GP/#SS/#PF/#AC";
    case Ending::kOther: return "other stop";
    case Ending::kHang: return "instruction budget exhausted";
  }
  return "?";
}

std::vector<uint8_t> host_tail() { return {0xff, 0x24, 0x25, 0xa0, 0x00, 0x60, 0x00}; }  // jmp [0x6000a0]
std::vector<uint8_t> guest_tail() { return {0xf4}; }                                     // hlt

namespace {

RegisterFile* g_state = nullptr;
uint8_t* g_code = nullptr;
uint8_t* g_data = nullptr;

void* map_fixed(uint64_t address, uint64_t size, int prot) {
  void* p = mmap(reinterpret_cast<void*>(address), size, prot, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (p != reinterpret_cast<void*>(address)) {
    std::fprintf(stderr, "diff: cannot map %#lx (%lu bytes) at its fixed address: %s\n", static_cast<unsigned long>(address),
                 static_cast<unsigned long>(size), p == MAP_FAILED ? std::strerror(errno) : "placed elsewhere");
    return nullptr;
  }
  return p;
}

// The sequences run in this process: a fault (or the alarm of a hang) jumps back out of the signal handler.
sigjmp_buf g_fault_jump;
volatile sig_atomic_t g_running = 0;
volatile sig_atomic_t g_fault_signal = 0;
volatile sig_atomic_t g_fault_code = 0;

void on_fault(int signal, siginfo_t* info, void*) {
  if (!g_running) {  // not the sequence's: the default action
    ::signal(signal, SIG_DFL);
    ::raise(signal);
    return;
  }
  g_running = 0;
  g_fault_signal = signal;
  g_fault_code = info->si_code;
  siglongjmp(g_fault_jump, 1);
}

bool ensure_mappings() {
  if (g_state) return true;
  g_code = static_cast<uint8_t*>(map_fixed(kCodeAddr, kCodeSize, PROT_READ | PROT_WRITE | PROT_EXEC));
  g_data = static_cast<uint8_t*>(map_fixed(kDataAddr, kDataSize, PROT_READ | PROT_WRITE));
  g_state = static_cast<RegisterFile*>(map_fixed(kStateAddr, 0x1000, PROT_READ | PROT_WRITE));
  if (!g_code || !g_data || !g_state) return false;
  static uint8_t alt_stack[64 * 1024];
  stack_t ss{};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof(alt_stack);
  sigaltstack(&ss, nullptr);
  struct sigaction action {};
  action.sa_sigaction = on_fault;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  for (int s : {SIGFPE, SIGSEGV, SIGILL, SIGBUS, SIGTRAP, SIGALRM}) sigaction(s, &action, nullptr);
  return true;
}

Ending ending_for_vector(int vector) {
  switch (vector) {
    case 0: return Ending::kDivideError;
    case 16:
    case 19: return Ending::kSimdFault;
    case 6: return Ending::kInvalidOpcode;
    case 12: case 13: case 14: case 17: return Ending::kMemoryFault;
    default: return Ending::kOther;
  }
}

}  // namespace

Outcome run_native(const std::vector<uint8_t>& code, const RegisterFile& regs, const std::vector<uint8_t>& data) {
  Outcome out;
  if (!ensure_mappings()) {
    out.ending = Ending::kOther;
    return out;
  }
  std::memset(g_code, 0xcc, kCodeSize);
  std::memcpy(g_code, code.data(), std::min<size_t>(code.size(), kCodeSize));
  std::memcpy(g_data, data.data(), std::min<size_t>(data.size(), kDataSize));
  *g_state = regs;
  g_state->code_entry = kCodeAddr;
  g_state->exit_target = reinterpret_cast<uint64_t>(&deja_diff_exit);
  // In this process, not a forked child (a fork a sequence was 90% of the tester's time): the generated code
  // touches only its registers, the data page and its stack there; a fault or a hang (the alarm) comes back
  // through the signal handler's jump, and the host's x87, MXCSR and direction flag are reset after it.
  if (sigsetjmp(g_fault_jump, 1) == 0) {
    g_running = 1;
    alarm(5);
    deja_diff_enter();
    alarm(0);
    g_running = 0;
    out.regs = *g_state;
    out.data.assign(g_data, g_data + kDataSize);
    return out;
  }
  alarm(0);
  const uint32_t mxcsr = 0x1f80;
  asm volatile("fninit\n\tcld\n\tldmxcsr %0" : : "m"(mxcsr));
  const int signal = g_fault_signal;
  out.detail = signal;
  switch (signal) {
    case SIGFPE: out.ending = g_fault_code == FPE_INTDIV || g_fault_code == FPE_INTOVF ? Ending::kDivideError : Ending::kSimdFault; break;
    case SIGILL: out.ending = Ending::kInvalidOpcode; break;
    case SIGSEGV:
    case SIGBUS: out.ending = Ending::kMemoryFault; break;
    case SIGALRM: out.ending = Ending::kHang; break;
    default: out.ending = Ending::kOther; break;
  }
  return out;
}

namespace {

constexpr uint64_t kPml4 = 0x1000, kPdpt = 0x2000, kPd = 0x3000, kIdt = 0x4000, kGdt = 0x5000, kTss = 0x6000;
constexpr uint64_t kRamSize = 16 << 20;

SegmentReg flat(uint16_t selector, uint8_t type, bool l, bool db) {
  SegmentReg s;
  s.selector = selector;
  s.limit = 0xffffffff;
  s.type = type;
  s.present = true;
  s.s = true;
  s.l = l;
  s.db = db;
  s.g = true;
  return s;
}

bool write64(GuestMemory& memory, uint64_t gpa, uint64_t value) { return memory.write_obj(Gpa{gpa}, value).has_value(); }

}  // namespace

std::unique_ptr<GuestMachine> GuestMachine::create(std::optional<InterpMode> mode, const CpuModel* model) {
  if (!model) {
    for (const CpuModel* m : CpuModel::all()) {
      if (!m->first_missing(interp_features())) {
        model = m;
        break;
      }
    }
  }
  auto memory = GuestMemory::create(kRamSize);
  if (!memory) {
    std::fprintf(stderr, "diff: guest memory: %s\n", memory.error().message.c_str());
    return nullptr;
  }
  auto machine = std::make_unique<GuestMachine>();
  machine->memory_ = std::make_unique<GuestMemory>(std::move(*memory));
  GuestMemory& m = *machine->memory_;
  bool ok = write64(m, kPml4, kPdpt | 7) && write64(m, kPdpt, kPd | 7);
  for (uint64_t i = 0; i < 512; ++i) ok = ok && write64(m, kPd + i * 8, (i << 21) | 0x87);  // 2 MiB pages
  const uint64_t code64 = 0xffff | (0xfull << 48) | (0xbull << 40) | (1ull << 44) | (1ull << 47) | (1ull << 53) | (1ull << 55);
  const uint64_t data = 0xffff | (0xfull << 48) | (0x3ull << 40) | (1ull << 44) | (1ull << 47) | (1ull << 54) | (1ull << 55);
  ok = ok && write64(m, kGdt + 0x08, code64) && write64(m, kGdt + 0x10, data);
  const uint64_t tss = 0x67 | ((kTss & 0xffffff) << 16) | (0x9ull << 40) | (1ull << 47);
  ok = ok && write64(m, kGdt + 0x18, tss) && write64(m, kGdt + 0x20, 0);
  for (uint64_t vector = 0; vector < 32; ++vector) {
    const uint64_t handler = kHandlerAddr + vector * 16;
    const uint64_t gate = (handler & 0xffff) | (0x08ull << 16) | (0xeull << 40) | (1ull << 47) | (((handler >> 16) & 0xffff) << 48);
    ok = ok && write64(m, kIdt + vector * 16, gate) && write64(m, kIdt + vector * 16 + 8, handler >> 32);
    const uint8_t hlt = 0xf4;
    ok = ok && m.write(Gpa{handler}, std::span(&hlt, 1)).has_value();
  }
  if (!ok) return nullptr;
  machine->model_ = model;
  machine->cpu_ = std::make_unique<InterpBackend>(m, *model);
  if (mode) machine->cpu_->set_mode(*mode);
  auto state = machine->cpu_->get_state();
  if (!state) return nullptr;
  CpuState& s = *state;
  s.cr0 = cr0::kPe | cr0::kPg | cr0::kEt | cr0::kWp | cr0::kNe | cr0::kMp;
  s.cr3 = kPml4;
  s.cr4 = cr4::kPae | cr4::kOsfxsr | cr4::kOsxmmexcpt;
  s.efer = efer::kLme | efer::kLma | efer::kSce | efer::kNxe;
  if (model->cpuid(1, 0).ecx & (1u << 28)) {  // AVX: the OS enables its state, as Linux does
    s.cr4 |= cr4::kOsxsave;
    s.xcr0 = xcr0::kX87 | xcr0::kSse | xcr0::kAvx;
  }
  s.cs = flat(0x08, 0xb, true, false);
  s.ds = s.es = s.ss = s.fs = s.gs = flat(0x10, 0x3, false, true);
  s.tr = SegmentReg{kTss, 0x67, 0x18, 0xb, 0, true, false, false, false, false, false, false};
  s.gdt = {kGdt, 0x27};
  s.idt = {kIdt, 32 * 16 - 1};
  s.ldt.unusable = true;
  const uint16_t fcw = 0x37f;
  std::memcpy(&s.fxsave[0], &fcw, 2);
  const uint32_t mxcsr_mask = 0xffff;
  std::memcpy(&s.fxsave[28], &mxcsr_mask, 4);
  machine->base_ = s;
  return machine;
}

bool GuestMachine::prepare(const std::vector<uint8_t>& code, const RegisterFile& regs,
                           const std::vector<uint8_t>& data) {
  if (!memory_->write(Gpa{kCodeAddr}, code) || !memory_->write(Gpa{kDataAddr}, data)) return false;
  CpuState s = base_;
  for (int i = 0; i < 16; ++i) s.gpr[i] = regs.gpr[i];
  s.rflags = regs.rflags;
  s.rip = kCodeAddr;
  std::memcpy(&s.fxsave[0], regs.fx.data(), 24);     // FCW, FSW, FTW, FOP, FIP, FDP
  std::memcpy(&s.fxsave[32], &regs.fx[32], 128);     // ST0-ST7
  std::memcpy(&s.fxsave[24], &regs.mxcsr, 4);
  for (int i = 0; i < 16; ++i) std::memcpy(&s.fxsave[160 + 16 * i], regs.xmm[i].data(), 16);
  for (int i = 0; i < 16; ++i) std::memcpy(&s.ymmh[16 * i], regs.ymmh[i].data(), 16);
  return cpu_->set_state(s).has_value();
}

Outcome GuestMachine::run(const std::vector<uint8_t>& code, const RegisterFile& regs, const std::vector<uint8_t>& data,
                          uint64_t budget) {
  Outcome out;
  out.ending = Ending::kOther;
  if (!prepare(code, regs, data)) return out;
  cpu_->set_instruction_budget(budget);
  auto exit = cpu_->run();
  if (!exit) {
    out.detail = -1;
    return out;
  }
  auto after = cpu_->get_state();
  if (!after) return out;
  for (int i = 0; i < 16; ++i) out.regs.gpr[i] = after->gpr[i];
  out.regs.rflags = after->rflags;
  std::memcpy(&out.regs.mxcsr, &after->fxsave[24], 4);
  for (int i = 0; i < 16; ++i) std::memcpy(out.regs.xmm[i].data(), &after->fxsave[160 + 16 * i], 16);
  for (int i = 0; i < 16; ++i) std::memcpy(out.regs.ymmh[i].data(), &after->ymmh[16 * i], 16);
  out.regs.ymm = regs.ymm;
  std::memcpy(out.regs.fx.data(), after->fxsave.data(), 512);
  // FNSTENV's view of the pointers: FIP, FOP (above FCS) and FDP, truncated to 32 bits.
  std::memcpy(&out.regs.env[12], &after->fxsave[8], 4);
  const uint32_t fop_field = uint32_t(after->fxsave[6] | (after->fxsave[7] << 8)) << 16;
  std::memcpy(&out.regs.env[16], &fop_field, 4);
  std::memcpy(&out.regs.env[20], &after->fxsave[16], 4);
  out.data.resize(kDataSize);
  (void)memory_->read(Gpa{kDataAddr}, out.data);
  const VcpuExit& e = **exit;
  if (e.kind == ExitKind::kHlt) {
    const uint64_t hlt_at = after->rip - 1;
    if (hlt_at >= kHandlerAddr && hlt_at < kHandlerAddr + 32 * 16) {
      out.detail = static_cast<int>((hlt_at - kHandlerAddr) / 16);
      out.ending = ending_for_vector(out.detail);
    } else if (hlt_at == kCodeAddr + code.size() - 1) {
      out.ending = Ending::kCompleted;
    } else {
      out.detail = static_cast<int>(hlt_at - kCodeAddr);
    }
  } else if (e.kind == ExitKind::kKicked) {
    out.ending = Ending::kHang;
  } else {
    out.detail = static_cast<int>(e.kind);
  }
  return out;
}

}  // namespace deja::difftest
