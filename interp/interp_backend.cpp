// The software CPU's run loop: decode-cache fetch, retirement and progress counting, exits, interrupts, state.
#include "interp/interp_backend.h"

#include <Zydis/Zydis.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "devices/state_codec.h"
#include "interp/avx.h"
#include "interp/jit.h"

namespace deja {

namespace {
constexpr uint8_t kDb = 1, kNmi = 2;
}

InterpBackend::InterpBackend(GuestMemory& memory, const CpuModel& model)
    : memory_(memory), model_(model), ram_(memory.host_base()), ram_size_(memory.size()), cache_(memory.size()),
      dirty_bits_(memory.dirty_bitmap().data()), blocks_(memory.size(), interp::BlockCache::capacity_for(memory.size())) {
  // Architectural reset values for the x87/SSE control words (SDM 9.1.1).
  uint16_t fcw = 0x37f;
  uint32_t mxcsr = 0x1f80;
  std::memcpy(s_.fxsave.data(), &fcw, 2);
  std::memcpy(s_.fxsave.data() + 24, &mxcsr, 4);
  s_.cr0 = cr0::kEt;
  using interp::VexIsa;
  vex_features_[size_t(VexIsa::kAvx)] = model_has(1, 2, 28);
  vex_features_[size_t(VexIsa::kAvx2)] = model_has(1, 2, 28) && model_has(7, 1, 5);
  vex_features_[size_t(VexIsa::kFma)] = model_has(1, 2, 28) && model_has(1, 2, 12);
  vex_features_[size_t(VexIsa::kF16c)] = model_has(1, 2, 28) && model_has(1, 2, 29);
  vex_features_[size_t(VexIsa::kBmi1)] = model_has(7, 1, 3);
  vex_features_[size_t(VexIsa::kBmi2)] = model_has(7, 1, 8);
  vex_features_[size_t(VexIsa::kAes)] = model_has(1, 2, 28) && model_has(1, 2, 25);
  vex_features_[size_t(VexIsa::kPclmul)] = model_has(1, 2, 28) && model_has(1, 2, 1);
  // The jump cache names live blocks only (as links do): a dropped block leaves it at once.
  blocks_.set_drop_listener([this](const interp::Block& block) {
    JumpEntry& entry = jump_cache_[jump_index(block.rip)];
    if (entry.block == &block) entry = JumpEntry{};
  });
}

InterpBackend::~InterpBackend() = default;

uint8_t InterpBackend::decode_mode() const {
  if (!(s_.cr0 & cr0::kPe)) return interp::kMode16;
  if (mode64()) return interp::kMode64;
  return s_.cs.db ? interp::kMode32 : interp::kMode16;
}

const interp::DecodedInsn& InterpBackend::fetch_decoded() {
  const uint8_t mode = decode_mode();
  const uint64_t linear = mode == interp::kMode64 ? s_.rip : ((s_.cs.base + s_.rip) & 0xffffffffu);
  const uint8_t fetch_key = uint8_t(mode | (cpl() << 4));
  if ((linear >> 12) == fetch_page_ && fetch_key == fetch_mode_ && cache_.generation() == fetch_cache_generation_)
      [[likely]] {
    if (uint16_t slot = fetch_slots_[linear & 0xfff]) [[likely]] {
      interp::DecodedInsn& cached = fetch_insns_[slot - 1];
      if (cached.mode == mode) [[likely]] return cached;
    }
  }
  fetch_page_ = ~0ull;
  if (mode == interp::kMode64) canonical_check(linear, false);
  const uint64_t phys = translate(linear, Access::kExec, is_user());
  const interp::DecodedInsn& insn = fetch_decoded_slow(linear, phys, mode);
  // Remember where this page's decoded code lives (after any insert that may have moved it).
  if (cache_.view(phys >> 12, fetch_slots_, fetch_insns_)) {
    fetch_page_ = linear >> 12;
    fetch_phys_ = phys & ~0xfffull;
    fetch_mode_ = fetch_key;
    fetch_cache_generation_ = cache_.generation();
  }
  return insn;
}

const interp::DecodedInsn& InterpBackend::fetch_decoded_slow(uint64_t linear, uint64_t phys, uint8_t mode) {
  if (phys >= ram_size_) {
    exit_ = VcpuExit{};
    exit_.kind = ExitKind::kFault;
    exit_.detail = fmt::format("instruction fetch from guest-physical {:#x}, outside RAM ({:#x} bytes), at rip {:#x}",
                               phys, ram_size_, s_.rip);
    exit_.rip = s_.rip;
    throw ExitRequest{};
  }
  if (interp::DecodedInsn* cached = cache_.find(phys, mode)) [[likely]] return *cached;
  const uint64_t in_page = 4096 - (phys & 0xfff);
  const uint64_t available = std::min<uint64_t>({15, in_page, ram_size_ - phys});
  interp::DecodedInsn decoded;
  if (interp::decode_bytes(ram_ + phys, available, mode, decoded)) {
    const bool was_code = is_code_page(phys >> 12);
    interp::DecodedInsn* entry = cache_.insert(phys, decoded);
    if (!was_code) code_appeared(phys >> 12);  // stores into the page must now check for code
    return *entry;
  }
  // The instruction continues on the next page: fetch through the MMU, decode without caching.
  uint8_t bytes[15];
  std::memcpy(bytes, ram_ + phys, available);
  size_t total = available;
  const uint64_t next_linear = linear + available;
  const uint64_t next_phys = translate(mode == interp::kMode64 ? next_linear : (next_linear & 0xffffffffu),
                                       Access::kExec, is_user());
  for (; total < 15 && next_phys + (total - available) < ram_size_; ++total) bytes[total] = ram_[next_phys + (total - available)];
  if (!interp::decode_bytes(bytes, total, mode, scratch_)) {
    scratch_ = interp::DecodedInsn{};
    scratch_.mode = mode;
    scratch_.length = 1;
  }
  return scratch_;
}

void InterpBackend::begin_step(uint64_t rip) {
  insn_rip_ = rip;
  response_cursor_ = 0;
  shadow_next_ = false;
  software_interrupt_ = -1;
  icebp_ = false;
  rep_continues_ = false;
  hlt_executed_ = false;
  pause_executed_ = false;
  store_through_ = false;
  locked_executed_ = false;
  watch_hit_.reset();
}

void InterpBackend::take_fault(const GuestException& fault) {
  responses_.clear();
  s_.interrupt_shadow = false;
  ++faulted_;
  deliver_event(fault.vector, fault.has_error_code, fault.error_code, false, insn_rip_);
}

void InterpBackend::step() {
  cache_.release_retired();
  begin_step(s_.rip);
  const bool single_step = s_.rflags & rflags::kTf;
  uint16_t mnemonic = 0;
  try {
    const interp::DecodedInsn* fetched = &fetch_decoded();
    if (store_buffer_ && !store_buffer_->empty() && fetch_sees_buffered_store(*fetched)) [[unlikely]] {
      drain_store_buffer();
      fetched = &fetch_decoded();
    }
    const interp::DecodedInsn& insn = *fetched;
    locked_executed_ = lock_exits_ && interp::is_locked(insn);
    mnemonic = insn.mnemonic;
    next_rip_ = insn_rip_ + insn.length;
    if (insn.mode != interp::kMode64) next_rip_ &= insn.mode == interp::kMode16 ? 0xffff : 0xffffffffu;
    if (store_buffer_ && interp::orders_memory(insn)) [[unlikely]] {
      drain_store_buffer();
      store_through_ = true;
    }
    execute(insn);
    if (exit_pending_) return;  // (defer_exit: not retired, as when request_exit throws)
  } catch (const GuestException& ex) {
    take_fault(ex);
    return;
  }
  // Retired.
  responses_.clear();
  s_.rip = next_rip_;
  ++steps_;
  if (rep_continues_) ++rep_partial_;
  if (store_buffer_) [[unlikely]] {
    store_buffer_->retire();
    while (store_buffer_->due()) commit_oldest_store();
  }
  s_.interrupt_shadow = shadow_next_;
  if (hlt_executed_) {
    s_.halted = true;
    hlt_rip_ = insn_rip_;
    hlt_unreported_ = true;
  }
  if (pause_executed_) {
    pause_rip_ = insn_rip_;
    pause_unreported_ = true;
  }
  if (locked_executed_) {
    lock_rip_ = insn_rip_;
    lock_unreported_ = true;
  }
  if (software_interrupt_ >= 0) {
    deliver_event(uint8_t(software_interrupt_), false, 0, !icebp_, s_.rip);
  } else if (single_step && trap_flag_steps()) {
    // The VMM's step, which KVM takes for every #DB (a guest's own TF too). SYSCALL and SYSRET trap on the TF they
    // leave (QEMU's TCG rechecks it; processors: Linux never SYSRETs with TF set, which would trap in user mode), not
    // the one they found; MOV SS and POP SS hold the trap until after the next instruction.
    const bool rechecks = mnemonic == ZYDIS_MNEMONIC_SYSCALL || mnemonic == ZYDIS_MNEMONIC_SYSRET;
    const bool holds = shadow_next_ && mnemonic != ZYDIS_MNEMONIC_STI;
    trap_flag_trapped_ = rechecks ? (s_.rflags & rflags::kTf) != 0 : !holds;
  } else if (single_step) {
    deliver_event(kDb, false, 0, false, s_.rip);
  }
}

void InterpBackend::invalidate_vmm_writes() {
  // Page numbers (gpa / 4096), as GuestMemory::write records them; taken once, for every vCPU sharing code.
  const std::vector<uint64_t> pages = memory_.take_vmm_dirty_pages();
  if (pages.empty()) return;
  InterpBackend* self = this;
  for (InterpBackend* cpu : peers_ ? std::span<InterpBackend* const>(peers_->vcpus) : std::span(&self, 1)) {
    for (uint64_t pfn : pages) {
      cpu->cache_.invalidate(pfn);
      cpu->blocks_.invalidate_page(pfn);
    }
  }
}

void InterpBackend::share_code(std::span<InterpBackend* const> vcpus) {
  auto peers = std::make_shared<CodePeers>();
  peers->vcpus.assign(vcpus.begin(), vcpus.end());
  peers->code.assign(vcpus.empty() ? 0 : vcpus.front()->memory_.size() / 4096, 0);
  for (InterpBackend* cpu : vcpus) {
    for (uint64_t pfn = 0; pfn < peers->code.size(); ++pfn) peers->code[pfn] |= cpu->own_code_page(pfn);
  }
  for (InterpBackend* cpu : vcpus) {
    cpu->peers_ = peers;
    for (const uint16_t index : cpu->tlb_live_) cpu->fill_fast_tags(cpu->tlb_[index]);
  }
}

void InterpBackend::code_appeared(uint64_t pfn) {
  if (!peers_) {
    revoke_fast_writes(pfn);
    return;
  }
  if (pfn < peers_->code.size()) peers_->code[pfn] = 1;
  for (InterpBackend* cpu : peers_->vcpus) cpu->revoke_fast_writes(pfn);
}

Result<VcpuExit*> InterpBackend::run() {
  invalidate_vmm_writes();
  if (memory_.dirty_generation() != dirty_generation_) {
    // The checkpoint dirty bitmap was cleared: fast stores (which do not mark) must find their pages
    // marked again, so they take the slow path once per page.
    dirty_generation_ = memory_.dirty_generation();
    for (const uint16_t index : tlb_live_) fill_fast_tags(tlb_[index]);
  }
  if (exit_outstanding_) {
    exit_outstanding_ = false;
    uint64_t key = 0;
    switch (exit_.kind) {
      case ExitKind::kIoIn: case ExitKind::kIoOut: key = exit_.port; break;
      case ExitKind::kMmioRead: case ExitKind::kMmioWrite: key = exit_.address; break;
      case ExitKind::kMsrRead: case ExitKind::kMsrWrite: key = exit_.msr; break;
      default: break;
    }
    responses_.push_back(Response{exit_.kind, key, exit_.value, exit_.ok, exit_.fault});
  }
  // KVM's rule (kvm_backend.cpp run()): the step's trap flag is set again before every run but one after a kick, which
  // must go on exactly as it would have without the kick; an instruction that cleared it leaves the vCPU unstepped.
  if (trap_flag_steps() && (exit_.kind != ExitKind::kKicked || state_set_since_exit_)) s_.rflags |= rflags::kTf;
  state_set_since_exit_ = false;
  auto finish = [&](ExitKind kind) -> VcpuExit* {
    exit_ = VcpuExit{};
    exit_.kind = kind;
    exit_.rip = s_.rip;
    return &exit_;
  };
  auto finish_deferred_exit = [&]() -> VcpuExit* {  // what the ExitRequest catch below does
    exit_pending_ = false;
    exit_outstanding_ = true;
    return &exit_;
  };
  for (;;) {
    if (shutdown_) {
      VcpuExit* out = finish(ExitKind::kShutdown);
      out->detail = shutdown_detail_ + "\n" + format_cpu_state(s_);
      return out;
    }
    if (responses_.empty()) {
      // Every HLT is reported as an exit before anything else happens, as KVM does: the VMM counts
      // guest-caused exits, and exit-synchronous coordinates must mean the same on both backends.
      // Nothing (a kick, a single step, an overflow) may stop between the HLT and its exit: that
      // point has the registers and exit count of the instruction after it, so an event placed
      // there would be replayed before the HLT ran.
      if (s_.halted && hlt_unreported_) {
        hlt_unreported_ = false;
        VcpuExit* out = finish(ExitKind::kHlt);
        out->rip = hlt_rip_;
        return out;
      }
      // A PAUSE's exit too comes first: the scheduler switches vCPUs there, at the same point on every backend.
      if (pause_unreported_) {
        pause_unreported_ = false;
        VcpuExit* out = finish(ExitKind::kPause);
        out->rip = pause_rip_;
        return out;
      }
      if (lock_unreported_) {
        lock_unreported_ = false;
        VcpuExit* out = finish(ExitKind::kLocked);
        out->rip = lock_rip_;
        return out;
      }
      if (block_step_done_) {
        block_step_done_ = false;
        return finish(ExitKind::kKicked);
      }
      // Between instructions: the only points where events are taken and coordinates compared. An NMI
      // first (SDM 6.9: it outranks INTR); the shadows of STI and MOV SS hold it too, as some processors do.
      if (nmi_pending_ && !nmi_blocked_ && !s_.interrupt_shadow) {
        nmi_pending_ = false;
        nmi_blocked_ = true;
        insn_rip_ = s_.rip;
        deliver_event(kNmi, false, 0, false, s_.rip);
        continue;
      }
      if (pending_irq_ && (s_.rflags & rflags::kIf) && !s_.interrupt_shadow) {
        uint8_t vector = *pending_irq_;
        pending_irq_.reset();
        insn_rip_ = s_.rip;
        deliver_event(vector, false, 0, false, s_.rip);
        continue;
      }
      if (trap_flag_steps() ? std::exchange(trap_flag_trapped_, false)
                            : debug_.single_step && executed() != step_origin_) {
        step_origin_ = executed();
        return finish(ExitKind::kDebug);
      }
      if (watch_hit_) {
        VcpuExit* out = finish(ExitKind::kDebug);
        out->watch_hit = true;
        out->address = watch_hit_->address;
        out->watch_kind = uint8_t(watch_hit_->kind);
        out->rip = watch_hit_->rip;
        watch_hit_.reset();
        return out;
      }
      if (debug_.stop_at_step && executed() >= *debug_.stop_at_step) return finish(ExitKind::kDebug);
      if (debug_.breakpoint && !s_.halted && *debug_.breakpoint == current_linear_rip()) return finish(ExitKind::kDebug);
      if (!debug_.breakpoints.empty() && !s_.halted && user_breakpoint_here()) return finish(ExitKind::kDebug);
      if (overflow_at_ && branches_ >= *overflow_at_) {
        overflow_at_.reset();
        return finish(ExitKind::kKicked);
      }
      if (kicked_.load(std::memory_order_relaxed)) {
        kicked_.store(false, std::memory_order_relaxed);
        return finish(ExitKind::kKicked);
      }
      if (budget_ != 0 && steps_ - budget_start_ >= budget_) {
        budget_ = 0;
        return finish(ExitKind::kKicked);
      }
      if (window_requested_ && can_inject_interrupt()) return finish(ExitKind::kInterruptWindow);
      if (s_.halted) {
        VcpuExit* out = finish(ExitKind::kHlt);
        out->rip = hlt_rip_;
        return out;
      }
    }
    try {
      // The fast path only where nothing between two instructions can need the run loop: no answer
      // of an exit pending, no single-step (the VMM's or the guest's TF), no interrupt shadow ending
      // after the next instruction.
      if (mode_ != InterpMode::kReference && !store_buffer_ && responses_.empty() && (!debug_.single_step || trap_flag_steps()) &&
          !(s_.rflags & rflags::kTf) && !s_.interrupt_shadow && !s_.halted) {
        run_fast();
        if (exit_pending_) return finish_deferred_exit();
        block_step_done_ = block_stepping_;
      } else {
        step();
        if (exit_pending_) return finish_deferred_exit();
      }
    } catch (const ExitRequest&) {
      if (exit_.kind == ExitKind::kFault) {
        responses_.clear();
        return &exit_;
      }
      exit_outstanding_ = true;
      return &exit_;
    }
  }
}

Result<CpuState> InterpBackend::get_state() {
  CpuState state = s_;
  if (trap_flag_steps()) state.rflags &= ~rflags::kTf;  // (KVM hides the step's TF too)
  return state;
}

Result<> InterpBackend::set_state(const CpuState& state) {
  s_ = state;
  s_.rflags |= 2;
  state_set_since_exit_ = true;
  // A new state abandons any half-executed instruction and every cached translation.
  responses_.clear();
  exit_outstanding_ = false;
  shutdown_ = false;
  flush_tlb(true);
  return {};
}

bool InterpBackend::can_inject_interrupt() {
  // With an exit outstanding (an I/O instruction waiting for its value), an injected interrupt is
  // delivered right after that instruction completes: what KVM does with KVM_INTERRUPT at an I/O exit.
  // An MSR access answered with a fault raises #GP first; the interrupt comes after it. KVM cannot take an
  // interrupt at such an exit at all (kvm_backend.cpp), so neither does this backend: both then inject at
  // the same later point, and traces stay interchangeable.
  if (exit_outstanding_ && exit_.fault && (exit_.kind == ExitKind::kMsrRead || exit_.kind == ExitKind::kMsrWrite)) {
    return false;
  }
  return (s_.rflags & rflags::kIf) && !s_.interrupt_shadow && !pending_irq_;
}

Result<> InterpBackend::inject_interrupt(uint8_t vector) {
  if (pending_irq_) return fail(ErrorKind::kGuest, "interp: interrupt {} injected while {} is still pending", vector, *pending_irq_);
  pending_irq_ = vector;
  return {};
}

Result<> InterpBackend::set_pause_exits(bool on) {
  // Blocks run PAUSE as a no-op: once it may exit, it stays with step(), so that turning exits off and on again (the
  // schedule does at every change of the other vCPUs' runnability) keeps the translated code.
  if (on && !pause_in_step_) {
    pause_in_step_ = true;
    blocks_.clear();
  }
  pause_exits_ = on;
  return {};
}

Result<> InterpBackend::set_lock_exits(bool on) {
  if (on != lock_exits_) {
    lock_exits_ = on;
    blocks_.clear();  // (blocks run locked instructions: they leave them for step() while they exit)
  }
  return {};
}

Result<> InterpBackend::set_debug(const DebugControl& control) {
  const bool watch_changed = control.watchpoints != debug_.watchpoints;
  // The trap flag goes with the step, as KVM_SET_GUEST_DEBUG sets or clears it.
  if (trap_flag_steps()) s_.rflags &= ~rflags::kTf;
  debug_ = control;
  trap_flag_trapped_ = false;
  if (trap_flag_steps()) s_.rflags |= rflags::kTf;
  // Pages with a watchpoint lose their fast tags (every access must be checked); pages without one get them back.
  if (watch_changed)
    for (const uint16_t index : tlb_live_) fill_fast_tags(tlb_[index]);
  step_origin_ = executed();
  return {};
}

bool InterpBackend::user_breakpoint_here() const {
  const uint64_t rip = current_linear_rip();
  for (uint64_t address : debug_.breakpoints)
    if (address == rip) return true;
  return false;
}

void InterpBackend::check_watch(uint64_t linear, unsigned size, bool write) {
  if (watch_hit_) return;
  for (const Watchpoint& w : debug_.watchpoints) {
    if (write ? w.kind == WatchKind::kRead : w.kind == WatchKind::kWrite) continue;
    if (linear < w.address + w.length && w.address < linear + size) {
      watch_hit_ = WatchHit{std::max(linear, w.address), w.kind, insn_rip_};
      return;
    }
  }
}

// Between run() calls with no exit outstanding, this and CpuState are the whole vCPU.
std::vector<uint8_t> InterpBackend::save_internal() {
  StateWriter w("INTP", 2);
  w.u64(steps_ - rep_partial_);
  w.u64(steps_);
  w.u64(branches_);
  w.u64(executed());
  w.boolean(pending_irq_.has_value());
  w.u8(pending_irq_.value_or(0));
  w.boolean(hlt_unreported_);
  w.u64(hlt_rip_);
  w.boolean(nmi_pending_);
  w.boolean(nmi_blocked_);
  return w.take();
}

Result<> InterpBackend::restore_internal(std::span<const uint8_t> state) {
  const uint8_t version = state.size() > 4 && state[4] == 1 ? 1 : 2;  // version 1: before NMIs
  StateReader r(state, "INTP", version);
  uint64_t instructions = r.u64(), steps = r.u64(), branches = r.u64(), executed = r.u64();
  bool has_irq = r.boolean();
  uint8_t irq = r.u8();
  bool hlt_unreported = r.boolean();
  uint64_t hlt_rip = r.u64();
  const bool nmi_pending = version >= 2 && r.boolean();
  const bool nmi_blocked = version >= 2 && r.boolean();
  if (auto done = r.finish(); !done) return done;
  nmi_pending_ = nmi_pending;
  nmi_blocked_ = nmi_blocked;
  steps_ = steps;
  rep_partial_ = steps - instructions;
  faulted_ = executed - steps;
  branches_ = branches;
  step_origin_ = executed;
  budget_start_ = steps;
  pending_irq_ = has_irq ? std::optional<uint8_t>(irq) : std::nullopt;
  hlt_unreported_ = hlt_unreported;
  hlt_rip_ = hlt_rip;
  overflow_at_.reset();
  watch_hit_.reset();
  // A restore rewrote RAM under the decode cache: the caller reports those pages through
  // GuestMemory's VMM-write list, taken at the next run().
  invalidate_fetch();
  return {};
}

Result<> InterpBackend::emulate_pmu_skid(uint64_t skid, uint64_t seed) {
  counter_.skid_ = skid;
  counter_.random_.seed(seed);
  return {};
}

std::vector<std::string> InterpBackend::statistics() const {
  std::vector<std::string> lines{fmt::format("interp executor: {}", interp_mode_name(mode_))};
  if (mode_ != InterpMode::kReference) {
    const FastStats fast = fast_stats();
    lines.push_back(fmt::format("  blocks translated {} ({} of them copied from the same code at another RIP), entered {} "
                                "(chained by lookup {}), instructions left to the reference executor {}",
                                fast.blocks_translated, fast.blocks_relocated, fast.blocks_entered, fast.chained,
                                fast.fallback_steps));
    lines.push_back(fmt::format("  blocks dropped by code writes {}, cache flushes {}, cache bytes {}",
                                fast.block_invalidations, fast.block_cache_flushes, fast.block_cache_bytes));
    if (const interp::TranslationHistory* history = blocks_.history()) {
      for (std::string& line : history->report()) lines.push_back(std::move(line));
    }
  }
  if (unimplemented_.empty()) {
    lines.push_back("unimplemented instructions: none executed");
  } else {
    lines.push_back("unimplemented instructions (raised #UD in the guest):");
    for (const auto& [mnemonic, count] : unimplemented_) lines.push_back(fmt::format("  {:<16} {}", mnemonic, count));
  }
  return lines;
}

std::string InterpBackend::Counter::describe() const {
  return skid_ == 0 ? std::string("interp") : fmt::format("emulated-pmu:{}", skid_);
}

Result<> InterpBackend::Counter::arm(uint64_t at) {
  uint64_t late = skid_ == 0 ? 0 : std::uniform_int_distribution<uint64_t>(0, skid_)(random_);
  cpu_.overflow_at_ = at + late;
  return {};
}

std::span<const std::string_view> interp_features() {
  // FPU: the whole x87 (interp/x87.cpp); MMX (interp/exec_mmx.cpp); SSE3-SSE4.2 (interp/exec_sse4.cpp), whose
  // floating point (ADDSUBPS, HADDPS, ROUNDPS, DPPS, ...) the host runs under the guest's MXCSR, as SSE's: a
  // host without SSE3 or SSE4.1 cannot provide them. BMI1/BMI2 in portable C++; XSAVE (with XGETBV(1)) and the
  // AVX family (interp/exec_avx.cpp) only on a host with AVX2, FMA and F16C, whose own instructions compute their
  // floating point (interp/avx.h). No SMAP here: its instructions stay #UD.
  static const std::vector<std::string_view> features = [] {
    std::vector<std::string_view> out = {"FPU", "PSE",    "TSC",   "MSR",     "PAE",       "CX8",     "PGE", "CMOV",
                                         "PAT", "CLFSH",  "MMX",   "FXSR",    "SSE",       "SSE2",    "CX16",
                                         "POPCNT", "MOVBE", "LAHF_LM", "ABM/LZCNT", "SYSCALL", "NX",  "LM",
                                         "SSSE3", "SSE4.2", "BMI1", "BMI2"};
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse3")) out.push_back("SSE3");
    if (__builtin_cpu_supports("sse4.1")) out.push_back("SSE4.1");
    if (interp::avx::host_supports_avx())
      for (std::string_view f : {"XSAVE", "XGETBV_ECX1", "AVX", "AVX2", "FMA", "F16C"}) out.push_back(f);
    return out;
  }();
  return features;
}

Result<std::unique_ptr<Backend>> make_interp_backend(GuestMemory& memory, const CpuModel& model) {
  if (memory.size() == 0 || memory.host_base() == nullptr)
    return fail(ErrorKind::kInvalidArgument, "interp: guest memory is not mapped");
  if (auto missing = model.first_missing(interp_features())) {
    return fail(ErrorKind::kUnsupported, "the software CPU does not implement {}, which CPU model {} advertises",
                missing->label(), model.name());
  }
  return std::unique_ptr<Backend>(new InterpBackend(memory, model));
}

std::vector<std::string> InterpBackend::cpu_quirks() const {
  std::vector<std::string> out;
  if (quirks_.accessed_only_by_segment_loads) out.emplace_back(kCpuQuirkAccessedBitOnlyBySegmentLoads);
  if (quirks_.fxsave_no_x87_pointers) out.emplace_back(kCpuQuirkFxsaveNoX87Pointers);
  if (quirks_.fxsave_skips_reserved_bytes) out.emplace_back(kCpuQuirkFxsaveSkipsReservedBytes);
  if (quirks_.x87_environment_zero_extended) out.emplace_back(kCpuQuirkX87EnvironmentZeroExtended);
  return out;
}

Result<> InterpBackend::adopt_software_tlb_entries(uint32_t entries) {
  if (entries < 16 || entries > kSoftwareTlbMaxEntries || (entries & (entries - 1)) != 0)
    return fail(ErrorKind::kUnsupported, "the software CPU cannot have a TLB of {} entries (a power of two from 16 to {})",
                entries, kSoftwareTlbMaxEntries);
  flush_tlb(true);
  tlb_mask_ = entries - 1;
  blocks_.clear();  // (JIT code has the TLB's size in it)
  return {};
}

Result<> InterpBackend::adopt_cpu_quirks(std::span<const std::string> quirks) {
  Quirks adopted;
  for (const std::string& quirk : quirks) {
    if (quirk == kCpuQuirkAccessedBitOnlyBySegmentLoads) {
      adopted.accessed_only_by_segment_loads = true;
    } else if (quirk == kCpuQuirkFxsaveNoX87Pointers) {
      adopted.fxsave_no_x87_pointers = true;
    } else if (quirk == kCpuQuirkFxsaveSkipsReservedBytes) {
      adopted.fxsave_skips_reserved_bytes = true;
    } else if (quirk == kCpuQuirkX87EnvironmentZeroExtended) {
      adopted.x87_environment_zero_extended = true;
    } else {
      return fail(ErrorKind::kUnsupported, "the software CPU cannot reproduce CPU quirk '{}'", quirk);
    }
  }
  quirks_ = adopted;
  return {};
}

}  // namespace deja
