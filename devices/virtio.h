// Virtio device types and their transports: what a device implements (VirtioDevice) and what a transport gives it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "devices/state_codec.h"
#include "devices/virtqueue.h"
#include "core/guest_memory.h"

namespace deja {

// Feature bits and status bits of the virtio 1.1 specification (OASIS, chapter 2 and 6).
namespace virtio {
constexpr uint64_t kFeatureIndirectDesc = 1ull << 28, kFeatureEventIdx = 1ull << 29, kFeatureVersion1 = 1ull << 32;
// The ring and transport features this implementation offers on every device.
constexpr uint64_t kTransportFeatures = kFeatureIndirectDesc | kFeatureEventIdx | kFeatureVersion1;
constexpr uint8_t kStatusAcknowledge = 1, kStatusDriver = 2, kStatusDriverOk = 4, kStatusFeaturesOk = 8,
                  kStatusNeedsReset = 64, kStatusFailed = 128;
// Device IDs (5 "Device Types").
constexpr uint16_t kIdNet = 1, kIdBlock = 2, kIdConsole = 3, kIdEntropy = 4;
// The largest queue any device here offers: bounds every chain walk and every per-queue array.
constexpr uint16_t kMaxQueueSize = 256;
}  // namespace virtio

// What a transport (virtio over PCI here; virtio-mmio could be another) offers the device behind it.
class VirtioTransport {
 public:
  virtual ~VirtioTransport() = default;
  virtual GuestMemory& memory() = 0;
  // The features the driver accepted (valid once FEATURES_OK).
  virtual uint64_t negotiated() const = 0;
  // Queue `q` may be used: DRIVER_OK, the queue enabled, and the device not waiting for a reset.
  virtual bool queue_ready(unsigned q) const = 0;
  // Chains the driver made available on `q` (0 when not ready or the index is bad). No side effects: the machine
  // may ask at any time, outside recorded events.
  virtual uint16_t available(unsigned q) = 0;
  // The next chain of a ready queue, or nullopt (none, or the driver broke a rule: the device then needs reset).
  virtual std::optional<VirtqChain> pop(unsigned q) = 0;
  // Returns a chain with `written` bytes written.
  virtual void push(unsigned q, uint16_t head, uint32_t written) = 0;
  // After pushes: a used-buffer notification if the driver wants one.
  virtual void notify_used(unsigned q) = 0;
  // The driver broke the device's rules: DEVICE_NEEDS_RESET and a configuration-change notification.
  virtual void device_error(const std::string& why) = 0;
};

// One virtio device type (block, network, entropy). The transport owns the queues, feature negotiation, status,
// notifications and interrupts; the device owns its configuration space and what a request means.
class VirtioDevice {
 public:
  virtual ~VirtioDevice() = default;
  virtual std::string_view name() const = 0;
  virtual uint16_t device_id() const = 0;
  virtual uint32_t pci_class() const = 0;
  // Device-type feature bits offered (the transport adds its own, kTransportFeatures).
  virtual uint64_t device_features() const = 0;
  virtual unsigned queue_count() const = 0;
  virtual uint16_t queue_max_size() const { return virtio::kMaxQueueSize; }
  virtual unsigned config_size() const = 0;
  // Device-specific configuration, [offset, offset + data.size()) within config_size().
  virtual void read_config(unsigned offset, std::span<uint8_t> data) = 0;
  virtual void write_config(unsigned /*offset*/, std::span<const uint8_t> /*data*/) {}
  // The driver reset the device (status 0).
  virtual void reset() = 0;
  // The driver notified queue `q`, which is ready (notifications before DRIVER_OK are passed on at DRIVER_OK).
  virtual void queue_notified(unsigned q) = 0;
  // Timed work (request completion), like other timed devices: due at a virtual time, done by advance().
  virtual std::optional<uint64_t> next_deadline_ns() const { return std::nullopt; }
  virtual void advance(uint64_t /*now_ns*/) {}
  // Device-type state (the transport saves its own).
  virtual void save(StateWriter& w) const = 0;
  virtual void restore(StateReader& r) = 0;

  void bind(VirtioTransport& transport) { transport_ = &transport; }

 protected:
  VirtioTransport& transport() { return *transport_; }
  const VirtioTransport& transport() const { return *transport_; }

 private:
  VirtioTransport* transport_ = nullptr;
};

}  // namespace deja
