// PCI host bridge: mechanism #1 decoding, BAR windows on the buses, wired-OR INTx lines.
#include "devices/pci_host.h"

#include <algorithm>

namespace deja {
namespace {
constexpr uint32_t kEnableBit = 0x80000000u;
constexpr uint32_t kAddressMask = 0x80fffffcu;  // bits 30:24 and 1:0 are reserved, read as 0
}  // namespace

PciHostBridgeFunction::PciHostBridgeFunction()
    : PciFunction(PciIds{.vendor = 0x8086, .device = 0x1237, .revision = 0x02, .class_code = 0x060000}) {}

PciHost::PciHost(Bus& pio, Bus& mmio, IrqSink& irqs) : pio_(pio), mmio_(mmio), irqs_(irqs) {
  slots_[0].function = &bridge_;
  bridge_.attached(*this, 0);
}

PciHost::~PciHost() {
  for (Slot& slot : slots_) {
    for (unsigned bar = 0; bar < pci::kBarCount; ++bar) {
      if (slot.mapped[bar]) slot.mapped[bar]->bus->remove(slot.mapped[bar]->base, slot.windows[bar].get());
    }
  }
}

Result<> PciHost::attach(unsigned slot, PciFunction& function, uint8_t irq) {
  if (slot == 0 || slot >= kSlots) return fail(ErrorKind::kInvalidArgument, "PCI slot {} is not 1-31", slot);
  if (slots_[slot].function) {
    return fail(ErrorKind::kInvalidArgument, "PCI slot {} already holds {}", slot, slots_[slot].function->name());
  }
  if (irq >= 16) return fail(ErrorKind::kInvalidArgument, "PCI slot {}: IRQ {} is not an ISA line", slot, irq);
  Slot& s = slots_[slot];
  s.function = &function;
  s.irq = irq;
  for (unsigned bar = 0; bar < pci::kBarCount; ++bar) s.windows[bar] = std::make_unique<BarWindow>(function, bar);
  function.attached(*this, slot);
  function.set_interrupt_line(irq);
  update_mappings(function);
  return {};
}

PciFunction* PciHost::addressed() const {
  if (!(config_address_ & kEnableBit)) return nullptr;
  const unsigned bus = (config_address_ >> 16) & 0xff, device = (config_address_ >> 11) & 0x1f,
                 function = (config_address_ >> 8) & 0x7;
  if (bus != 0 || function != 0) return nullptr;
  return slots_[device].function;
}

void PciHost::data_read(unsigned reg, std::span<uint8_t> data) {
  PciFunction* f = addressed();
  if (!f) {
    std::fill(data.begin(), data.end(), uint8_t{0xff});
    return;
  }
  store_le(data, f->config_read(reg, unsigned(data.size())));
}

void PciHost::data_write(unsigned reg, std::span<const uint8_t> data) {
  if (PciFunction* f = addressed()) f->config_write(reg, unsigned(data.size()), uint32_t(load_le(data)));
}

void PciHost::read(uint64_t offset, std::span<uint8_t> data) {
  if (offset == 0 && data.size() == 4) {
    store_le(data, config_address_);
    return;
  }
  // CONFIG_DATA: one access at 0xCFC + n when it stays inside the data dword and is naturally aligned.
  if (offset >= 4 && offset + data.size() <= 8 && (offset - 4) % data.size() == 0) {
    data_read(unsigned((config_address_ & 0xfc) + (offset - 4)), data);
    return;
  }
  std::fill(data.begin(), data.end(), uint8_t{0xff});
}

void PciHost::write(uint64_t offset, std::span<const uint8_t> data) {
  if (offset == 0 && data.size() == 4) {
    config_address_ = uint32_t(load_le(data)) & kAddressMask;
    return;
  }
  if (offset >= 4 && offset + data.size() <= 8 && (offset - 4) % data.size() == 0) {
    data_write(unsigned((config_address_ & 0xfc) + (offset - 4)), data);
  }
  // Anything else (a byte write to 0xCFB, a word to 0xCF8, an unaligned data access) is ignored.
}

void PciHost::update_mappings(PciFunction& function) {
  Slot& s = slots_[function.slot()];
  if (s.function != &function) return;  // not attached yet
  for (unsigned bar = 0; bar < pci::kBarCount; ++bar) {
    std::optional<uint64_t> want = function.bar_decoded_address(bar);
    Bus* bus = function.bar_kind(bar) == PciBarKind::kIo ? &pio_ : &mmio_;
    std::optional<Mapping>& have = s.mapped[bar];
    if (have && want && have->base == *want) continue;
    if (!have && !want) continue;
    if (have) {
      have->bus->remove(have->base, s.windows[bar].get());
      have.reset();
    }
    if (want) {
      if (bus->add(*want, function.bar_size(bar), s.windows[bar].get())) {
        have = Mapping{bus, *want};
      } else {
        ++refused_mappings_;  // overlaps another device: not decoded, as a conflicting decode would be lost
      }
    }
  }
}

void PciHost::drive_line(uint8_t irq) { irqs_.set_irq(irq, asserted_slots_[irq] != 0); }

void PciHost::set_intx(PciFunction& function, bool level) {
  const unsigned slot = function.slot();
  if (slots_[slot].function != &function || slot == 0) return;
  const uint8_t irq = slots_[slot].irq;
  const uint32_t before = asserted_slots_[irq];
  if (level) {
    asserted_slots_[irq] |= 1u << slot;
  } else {
    asserted_slots_[irq] &= ~(1u << slot);
  }
  if ((before != 0) != (asserted_slots_[irq] != 0)) drive_line(irq);
}

void PciHost::restore_intx(PciFunction& function, bool level) {
  const unsigned slot = function.slot();
  if (slots_[slot].function != &function || slot == 0) return;
  const uint8_t irq = slots_[slot].irq;
  if (level) {
    asserted_slots_[irq] |= 1u << slot;
  } else {
    asserted_slots_[irq] &= ~(1u << slot);
  }
}

std::vector<uint8_t> PciHost::save() const {
  StateWriter w("PCIH", 1);
  w.u32(config_address_);
  bridge_.save_config(w);
  return w.take();
}

Result<> PciHost::restore(std::span<const uint8_t> state) {
  StateReader r(state, "PCIH", 1);
  const uint32_t address = r.u32();
  if (address & ~kAddressMask) r.invalid(fmt::format("CONFIG_ADDRESS {:#x} has reserved bits set", address));
  bridge_.restore_config(r);
  if (auto done = r.finish(); !done) return done;
  config_address_ = address;
  return {};
}

}  // namespace deja
