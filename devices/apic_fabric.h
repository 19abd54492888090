// The APIC bus of a multiprocessor: I/O APIC messages, MSIs and IPIs to the local APICs they name; NMI, INIT, STARTUP to the vCPUs.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "devices/interrupts.h"

namespace deja {

class LocalApic;

// Delivery follows the Intel SDM vol. 3, 10.6 (IPIs) and 10.11 (MSIs), with every APIC on one bus:
// - destinations: physical (an APIC ID; 0xff, or 0xffffffff from an x2APIC ICR, is the broadcast), logical
//   (each APIC matches with its LDR and DFR: flat or cluster model, x2APIC cluster), and the IPI shorthands
//   self, all including self and all excluding self; a hardware-disabled APIC takes nothing;
// - lowest priority: one APIC among those named, the one with the lowest arbitration priority, the lowest
//   index on the bus among equals (the SDM leaves the tie to a rotating arbitration ID; a fixed rule keeps
//   the machine a function of its inputs);
// - a message that names no APIC present is lost (a P4/Xeon reports no send-accept error).
// NMI, INIT and STARTUP change a vCPU rather than an APIC register: they are held here, per vCPU, until the
// run loop applies them before the vCPU runs again (replay/session.cpp), with each vCPU's activity state
// (SDM 9.1): running, or waiting for a STARTUP (application processors from power-up, every vCPU after INIT).
// A STARTUP to a vCPU that is not waiting is ignored (a storm of them costs nothing), as is an NMI to one
// waiting for STARTUP.
class ApicFabric : public ApicBus, public MsiSink, public CpuSignalSink {
 public:
  enum class Activity : uint8_t { kRunning = 0, kWaitForSipi = 1 };
  // What waits for a vCPU.
  struct Pending {
    bool reset = false;                   // INIT: its state returns to the INIT state (it waits for STARTUP)
    std::optional<uint8_t> start_vector;  // STARTUP accepted: it starts in real mode at vector << 12
    bool nmi = false;
  };

  // `lapics` in vCPU order: index i is vCPU i, whose APIC the bus calls CPU i. vCPU 0 is the bootstrap
  // processor and starts running; the others wait for STARTUP.
  explicit ApicFabric(std::vector<LocalApic*> lapics);

  // ApicBus / MsiSink: messages from the I/O APIC, PCI devices and the local APICs' ICRs.
  bool deliver(const ApicMessage& message) override;
  void deliver_msi(uint64_t address, uint32_t data) override;

  // CpuSignalSink: what the local APICs received.
  void nmi(uint32_t cpu) override;
  void init(uint32_t cpu) override;
  void startup(uint32_t cpu, uint8_t vector) override;

  size_t cpus() const { return lapics_.size(); }
  Activity activity(uint32_t cpu) const { return cpus_[cpu].activity; }
  const Pending& pending(uint32_t cpu) const { return cpus_[cpu].pending; }
  // Hands what waits for `cpu` to the run loop, which applies it.
  Pending take_pending(uint32_t cpu);
  // Messages accepted by each vCPU's APIC since power-up, for --stats: INIT, STARTUP (accepted or not), NMI.
  struct Counts {
    uint64_t inits = 0, startups = 0, nmis = 0;
  };
  const Counts& counts(uint32_t cpu) const { return cpus_[cpu].counts; }

  // The vCPUs' activity and pending signals ("apic-bus" in checkpoints and digests).
  std::string_view name() const { return "apic-bus"; }
  std::vector<uint8_t> save() const;
  Result<> restore(std::span<const uint8_t> state);

 private:
  struct Cpu {
    Activity activity = Activity::kRunning;
    Pending pending;
    Counts counts;
  };
  std::vector<LocalApic*> lapics_;
  std::vector<Cpu> cpus_;
};

}  // namespace deja
