// The APIC bus: destination matching, lowest-priority arbitration, MSI decoding, and the vCPUs' NMI/INIT/STARTUP state.
#include "devices/apic_fabric.h"

#include <fmt/format.h>

#include "devices/lapic.h"
#include "devices/state_codec.h"

namespace deja {

ApicFabric::ApicFabric(std::vector<LocalApic*> lapics) : lapics_(std::move(lapics)), cpus_(lapics_.size()) {
  for (size_t i = 1; i < cpus_.size(); ++i) cpus_[i].activity = Activity::kWaitForSipi;
}

bool ApicFabric::deliver(const ApicMessage& m) {
  // Every APIC the message names (at most one per vCPU; the bus is small, so a linear scan).
  std::vector<uint32_t> named;
  for (uint32_t i = 0; i < lapics_.size(); ++i) {
    const LocalApic& apic = *lapics_[i];
    if (!apic.hw_enabled()) continue;
    bool hit = false;
    switch (m.shorthand) {
      case IpiShorthand::kNone: hit = apic.matches(m.logical, m.destination, m.x2_destination); break;
      case IpiShorthand::kSelf: hit = i == m.source; break;
      case IpiShorthand::kAllIncludingSelf: hit = true; break;
      case IpiShorthand::kAllExcludingSelf: hit = i != m.source; break;
    }
    if (hit) named.push_back(i);
  }
  if (m.delivery_mode == apic_delivery::kLowestPriority && named.size() > 1) {
    uint32_t chosen = named.front();
    for (uint32_t i : named) {
      if (lapics_[i]->apr() < lapics_[chosen]->apr()) chosen = i;
    }
    named = {chosen};
  }
  bool accepted = false;
  for (uint32_t i : named) accepted |= lapics_[i]->receive(m);
  return accepted;
}

void ApicFabric::deliver_msi(uint64_t address, uint32_t data) {
  if (auto m = decode_msi(address, data)) deliver(*m);
}

void ApicFabric::nmi(uint32_t cpu) {
  Cpu& c = cpus_.at(cpu);
  ++c.counts.nmis;
  if (c.activity == Activity::kRunning) c.pending.nmi = true;  // NMI is blocked while waiting for STARTUP
}

void ApicFabric::init(uint32_t cpu) {
  Cpu& c = cpus_.at(cpu);
  ++c.counts.inits;
  c.activity = Activity::kWaitForSipi;
  c.pending = Pending{.reset = true};
}

void ApicFabric::startup(uint32_t cpu, uint8_t vector) {
  Cpu& c = cpus_.at(cpu);
  ++c.counts.startups;
  if (c.activity != Activity::kWaitForSipi) return;
  c.activity = Activity::kRunning;
  c.pending.start_vector = vector;
}

ApicFabric::Pending ApicFabric::take_pending(uint32_t cpu) {
  Pending taken = cpus_.at(cpu).pending;
  cpus_[cpu].pending = Pending{};
  return taken;
}

namespace {
constexpr char kTag[] = "APBS";
constexpr uint8_t kVersion = 1;
}  // namespace

std::vector<uint8_t> ApicFabric::save() const {
  StateWriter w(kTag, kVersion);
  w.u32(uint32_t(cpus_.size()));
  for (const Cpu& c : cpus_) {
    w.u8(uint8_t(c.activity));
    w.boolean(c.pending.reset);
    w.boolean(c.pending.start_vector.has_value());
    w.u8(c.pending.start_vector.value_or(0));
    w.boolean(c.pending.nmi);
    w.u64(c.counts.inits);
    w.u64(c.counts.startups);
    w.u64(c.counts.nmis);
  }
  return w.take();
}

Result<> ApicFabric::restore(std::span<const uint8_t> state) {
  StateReader r(state, kTag, kVersion);
  const uint32_t n = r.u32();
  if (r.ok() && n != cpus_.size()) r.invalid(fmt::format("{} vCPUs saved, this machine has {}", n, cpus_.size()));
  std::vector<Cpu> cpus(cpus_.size());
  for (Cpu& c : cpus) {
    if (!r.ok()) break;
    const uint8_t activity = r.u8();
    if (activity > uint8_t(Activity::kWaitForSipi)) r.invalid(fmt::format("vCPU activity {} out of range", activity));
    c.activity = Activity(activity);
    c.pending.reset = r.boolean();
    const bool started = r.boolean();
    const uint8_t vector = r.u8();
    if (started) c.pending.start_vector = vector;
    c.pending.nmi = r.boolean();
    c.counts.inits = r.u64();
    c.counts.startups = r.u64();
    c.counts.nmis = r.u64();
  }
  if (auto done = r.finish(); !done) return done;
  cpus_ = std::move(cpus);
  return {};
}

}  // namespace deja
