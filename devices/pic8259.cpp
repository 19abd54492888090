// 8259A pair: per-chip command decoding and priority resolution, cascade wiring, INTA, state.
#include "devices/pic8259.h"

#include "devices/state_codec.h"

namespace deja {
namespace {

// Priority rank (0 = highest) of the best set bit when IR `priority_add` has the highest
// priority and the rest follow cyclically (datasheet "rotation"); 8 when no bit is set.
int best_priority(uint8_t mask, uint8_t priority_add) {
  if (mask == 0) return 8;
  int rank = 0;
  while (!(mask & (1u << ((rank + priority_add) & 7)))) ++rank;
  return rank;
}

// PIIX ELCR: IRQ0, 1, 2 (timer, keyboard, cascade) and IRQ8, 13 must stay edge-triggered.
constexpr uint8_t kMasterElcrMask = 0xf8;
constexpr uint8_t kSlaveElcrMask = 0xde;

}  // namespace

PicPair::PicPair() {
  master_.elcr_mask = kMasterElcrMask;
  slave_.elcr_mask = kSlaveElcrMask;
}

int PicPair::Chip::pending_irq(bool is_master) const {
  int rank = best_priority(irr & ~imr, priority_add);
  if (rank == 8) return -1;
  uint8_t in_service = isr;
  // Special mask mode: only masked levels in service keep blocking (datasheet, OCW3 SMM).
  if (special_mask) in_service &= ~imr;
  // Special fully nested mode lets a higher-priority slave request through while IR2 is in service.
  if (is_master && special_fully_nested) in_service &= ~(1u << 2);
  int current = best_priority(in_service, priority_add);
  if (rank < current) return (rank + priority_add) & 7;
  return -1;
}

void PicPair::Chip::set_line(unsigned ir, bool level) {
  uint8_t bit = uint8_t(1u << ir);
  bool was_high = line_levels & bit;
  if (level) {
    line_levels |= bit;
  } else {
    line_levels &= ~bit;
  }
  if (level_triggered() & bit) {
    if (level) {
      irr |= bit;
    } else {
      irr &= ~bit;
    }
  } else if (level && !was_high) {
    irr |= bit;
  }
}

void PicPair::Chip::acknowledge_ir(int ir) {
  uint8_t bit = uint8_t(1u << ir);
  if (auto_eoi) {
    if (rotate_on_auto_eoi) priority_add = uint8_t((ir + 1) & 7);
  } else {
    isr |= bit;
  }
  // A level-triggered request stays in IRR for as long as the line is high.
  if (!(level_triggered() & bit)) irr &= ~bit;
}

void PicPair::Chip::non_specific_eoi(bool rotate) {
  int rank = best_priority(isr, priority_add);
  if (rank == 8) return;
  int ir = (rank + priority_add) & 7;
  isr &= ~uint8_t(1u << ir);
  if (rotate) priority_add = uint8_t((ir + 1) & 7);
}

void PicPair::Chip::write_command(uint8_t value) {
  if (value & 0x10) {  // ICW1
    ltim = value & 0x08;
    single = value & 0x02;
    icw4_needed = value & 0x01;
    // The edge-sense latches are reset: a line already high must fall and rise again.
    irr = line_levels & level_triggered();
    isr = 0;
    imr = 0;
    priority_add = 0;
    special_mask = false;
    read_isr = false;
    poll = false;
    rotate_on_auto_eoi = false;
    if (!icw4_needed) {
      auto_eoi = false;
      special_fully_nested = false;
      mode_8086 = false;
      icw4_buffer_bits = 0;
    }
    init_step = 2;
    return;
  }
  if (value & 0x08) {  // OCW3
    if (value & 0x04) poll = true;
    if (value & 0x02) read_isr = value & 0x01;
    if (value & 0x40) special_mask = value & 0x20;
    return;
  }
  // OCW2: R, SL, EOI in bits 7..5, the level in bits 2..0.
  uint8_t level = value & 7;
  switch (value >> 5) {
    case 0: rotate_on_auto_eoi = false; break;
    case 1: non_specific_eoi(false); break;
    case 2: break;  // no operation
    case 3: isr &= ~uint8_t(1u << level); break;
    case 4: rotate_on_auto_eoi = true; break;
    case 5: non_specific_eoi(true); break;
    case 6: priority_add = uint8_t((level + 1) & 7); break;
    case 7:
      isr &= ~uint8_t(1u << level);
      priority_add = uint8_t((level + 1) & 7);
      break;
  }
}

void PicPair::Chip::write_data(uint8_t value) {
  switch (init_step) {
    case 2:  // ICW2
      vector_base = value & 0xf8;
      init_step = single ? (icw4_needed ? 4 : 0) : 3;
      break;
    case 3:  // ICW3
      icw3 = value;
      init_step = icw4_needed ? 4 : 0;
      break;
    case 4:  // ICW4
      mode_8086 = value & 0x01;
      auto_eoi = value & 0x02;
      icw4_buffer_bits = (value >> 2) & 3;
      special_fully_nested = value & 0x10;
      init_step = 0;
      break;
    default:  // OCW1
      imr = value;
      break;
  }
}

uint8_t PicPair::Chip::poll_read(bool is_master) {
  poll = false;
  int ir = pending_irq(is_master);
  if (ir < 0) return 0;
  // The datasheet: the read after a poll command acts as an interrupt acknowledge.
  acknowledge_ir(ir);
  return uint8_t(0x80 | ir);
}

uint8_t PicPair::Chip::read(uint64_t offset, bool is_master) {
  if (poll) return poll_read(is_master);
  if (offset == 0) return read_isr ? isr : irr;
  return imr;
}

void PicPair::set_irq(unsigned line, bool level) {
  DEJA_ASSERT(line < 16, "IRQ line {} does not exist on the 8259 pair", line);
  if (line < 8) {
    master_.set_line(line, level);
  } else {
    slave_.set_line(line - 8, level);
  }
  update_cascade();
}

void PicPair::update_cascade() { master_.set_line(2, slave_.pending_irq(false) >= 0); }

bool PicPair::interrupt_pending() const { return master_.pending_irq(true) >= 0; }

uint8_t PicPair::acknowledge() {
  uint8_t vector;
  int ir = master_.pending_irq(true);
  if (ir < 0) {
    // The request vanished between INTR and INTA: IR7's vector, no ISR bit.
    vector = uint8_t(master_.vector_base + 7);
  } else {
    master_.acknowledge_ir(ir);
    if (ir == 2 && cascaded()) {
      int slave_ir = slave_.pending_irq(false);
      if (slave_ir < 0) {
        // Spurious IRQ15: the master has already set its IR2 ISR bit, the slave sets none.
        vector = uint8_t(slave_.vector_base + 7);
      } else {
        slave_.acknowledge_ir(slave_ir);
        vector = uint8_t(slave_.vector_base + slave_ir);
      }
    } else {
      vector = uint8_t(master_.vector_base + ir);
    }
  }
  update_cascade();
  return vector;
}

void PicPair::ChipPorts::read(uint64_t offset, std::span<uint8_t> data) {
  Chip& chip = is_master_ ? pair_.master_ : pair_.slave_;
  // A wide access to an 8-bit ISA device is split into byte cycles at consecutive ports.
  for (size_t i = 0; i < data.size(); ++i) data[i] = chip.read((offset + i) & 1, is_master_);
  pair_.update_cascade();
}

void PicPair::ChipPorts::write(uint64_t offset, std::span<const uint8_t> data) {
  Chip& chip = is_master_ ? pair_.master_ : pair_.slave_;
  for (size_t i = 0; i < data.size(); ++i) {
    if (((offset + i) & 1) == 0) {
      chip.write_command(data[i]);
    } else {
      chip.write_data(data[i]);
    }
  }
  pair_.update_cascade();
}

Result<> PicPair::ChipPorts::restore(std::span<const uint8_t> state) {
  if (!state.empty()) {
    return fail(ErrorKind::kInvalidArgument, "{}: has no state of its own ({} bytes given); use PicPair::restore",
                name(), state.size());
  }
  return {};
}

void PicPair::ElcrPorts::read(uint64_t offset, std::span<uint8_t> data) {
  for (size_t i = 0; i < data.size(); ++i) data[i] = ((offset + i) & 1) ? pair_.slave_.elcr : pair_.master_.elcr;
}

void PicPair::ElcrPorts::write(uint64_t offset, std::span<const uint8_t> data) {
  for (size_t i = 0; i < data.size(); ++i) {
    Chip& chip = ((offset + i) & 1) ? pair_.slave_ : pair_.master_;
    chip.elcr = data[i] & chip.elcr_mask;
    // Lines that became level-triggered now request exactly while they are high.
    uint8_t level = chip.level_triggered();
    chip.irr = uint8_t((chip.irr & ~level) | (chip.line_levels & level));
  }
  pair_.update_cascade();
}

Result<> PicPair::ElcrPorts::restore(std::span<const uint8_t> state) {
  if (!state.empty()) {
    return fail(ErrorKind::kInvalidArgument, "{}: has no state of its own ({} bytes given); use PicPair::restore",
                name(), state.size());
  }
  return {};
}

namespace {
constexpr char kPicTag[] = "PIC2";
constexpr uint8_t kPicVersion = 1;
}  // namespace

std::vector<uint8_t> PicPair::save() const {
  StateWriter w(kPicTag, kPicVersion);
  for (const Chip* c : {&master_, &slave_}) {
    w.u8(c->irr);
    w.u8(c->isr);
    w.u8(c->imr);
    w.u8(c->line_levels);
    w.u8(c->elcr);
    w.u8(c->vector_base);
    w.u8(c->icw3);
    w.u8(c->init_step);
    w.u8(c->priority_add);
    w.boolean(c->icw4_needed);
    w.boolean(c->single);
    w.boolean(c->ltim);
    w.boolean(c->auto_eoi);
    w.boolean(c->rotate_on_auto_eoi);
    w.boolean(c->special_fully_nested);
    w.boolean(c->mode_8086);
    w.u8(c->icw4_buffer_bits);
    w.boolean(c->special_mask);
    w.boolean(c->read_isr);
    w.boolean(c->poll);
  }
  return w.take();
}

Result<> PicPair::restore(std::span<const uint8_t> state) {
  StateReader r(state, kPicTag, kPicVersion);
  Chip chips[2] = {master_, slave_};
  const char* names[2] = {"master", "slave"};
  for (int i = 0; i < 2; ++i) {
    Chip& c = chips[i];
    c.irr = r.u8();
    c.isr = r.u8();
    c.imr = r.u8();
    c.line_levels = r.u8();
    c.elcr = r.u8();
    c.vector_base = r.u8();
    c.icw3 = r.u8();
    c.init_step = r.u8();
    c.priority_add = r.u8();
    c.icw4_needed = r.boolean();
    c.single = r.boolean();
    c.ltim = r.boolean();
    c.auto_eoi = r.boolean();
    c.rotate_on_auto_eoi = r.boolean();
    c.special_fully_nested = r.boolean();
    c.mode_8086 = r.boolean();
    c.icw4_buffer_bits = r.u8();
    c.special_mask = r.boolean();
    c.read_isr = r.boolean();
    c.poll = r.boolean();
    if (!r.ok()) break;
    if (c.elcr & ~c.elcr_mask) r.invalid(fmt::format("{} ELCR {:#x} sets reserved bits", names[i], c.elcr));
    if (c.vector_base & 7) r.invalid(fmt::format("{} vector base {:#x} is not 8-aligned", names[i], c.vector_base));
    if (c.init_step == 1 || c.init_step > 4) {
      r.invalid(fmt::format("{} initialization step {} does not exist", names[i], c.init_step));
    }
    if (c.priority_add > 7) r.invalid(fmt::format("{} rotation {} is not an IR number", names[i], c.priority_add));
    if (c.icw4_buffer_bits > 3) r.invalid(fmt::format("{} ICW4 buffer bits {:#x} invalid", names[i], c.icw4_buffer_bits));
  }
  if (auto done = r.finish(); !done) return done;
  master_ = chips[0];
  slave_ = chips[1];
  return {};
}

}  // namespace deja
