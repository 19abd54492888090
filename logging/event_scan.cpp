// scan_event: walks the wire format against a table built once from trace.proto's descriptors, so a field added to
// the schema is known here too. It only says "sure" for encodings the full parse accepts (stricter where in doubt:
// canonical varints, short tags, shallow nesting), so verify's verdict is the full parse's on every event.
#include "logging/event_scan.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include <google/protobuf/descriptor.h>

#include "logging/trace.pb.h"

namespace deja {

namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

constexpr uint8_t kNotSure = 0xff;  // a field the scan leaves to the full parse (text, groups)
constexpr int kMaxDepth = 16;       // the schema nests three deep; the full parse allows 100

struct WireMessage {
  struct Field {
    uint8_t wire_type = kNotSure;
    int number = 0;
    const WireMessage* message = nullptr;  // for a nested message
    bool in_kind = false;                  // a member of Event's oneof `kind`
  };
  std::vector<Field> by_number;
  // The same fields by their one-byte tags (fields 1 to 15: all but a few), each under its own wire type only.
  std::array<Field, 128> by_tag_byte;
};

class WireSchema {
 public:
  WireSchema() : event_(build(trace::Event::descriptor())) {}
  const WireMessage& event() const { return *event_; }

 private:
  const WireMessage* build(const Descriptor* d) {
    auto& slot = built_[d];
    if (slot) return slot.get();
    slot = std::make_unique<WireMessage>();
    WireMessage* m = slot.get();
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      if (size_t(f->number()) >= m->by_number.size()) m->by_number.resize(size_t(f->number()) + 1);
      WireMessage::Field& w = m->by_number[size_t(f->number())];
      w.in_kind = d == trace::Event::descriptor() && f->containing_oneof() != nullptr;
      switch (f->type()) {
        case FieldDescriptor::TYPE_FIXED64:
        case FieldDescriptor::TYPE_SFIXED64:
        case FieldDescriptor::TYPE_DOUBLE: w.wire_type = 1; break;
        case FieldDescriptor::TYPE_FIXED32:
        case FieldDescriptor::TYPE_SFIXED32:
        case FieldDescriptor::TYPE_FLOAT: w.wire_type = 5; break;
        case FieldDescriptor::TYPE_BYTES: w.wire_type = 2; break;
        case FieldDescriptor::TYPE_MESSAGE:
          w.wire_type = 2;
          w.message = build(f->message_type());
          break;
        case FieldDescriptor::TYPE_STRING:  // proto3 text must be UTF-8: the full parse checks it
        case FieldDescriptor::TYPE_GROUP: w.wire_type = kNotSure; break;
        default: w.wire_type = 0; break;  // the varint types: ints, bool, enum
      }
      w.number = f->number();
      if (w.wire_type != kNotSure && f->number() < 16) m->by_tag_byte[size_t(f->number() << 3 | w.wire_type)] = w;
    }
    return m;
  }

  std::map<const Descriptor*, std::unique_ptr<WireMessage>> built_;
  const WireMessage* event_;
};

// A canonical varint of at most `max_bytes` bytes (a longer or padded one is left to the full parse).
inline bool read_varint(const uint8_t*& p, const uint8_t* end, uint64_t& value, int max_bytes) {
  if (p < end && *p < 0x80) [[likely]] {
    value = *p++;
    return true;
  }
  const int n = int(std::min<ptrdiff_t>(max_bytes, end - p));
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) {
    const uint8_t b = p[i];
    v |= uint64_t(b & 0x7f) << (7 * i);
    if (b < 0x80) {
      if (b == 0 || (i == 9 && b > 1)) return false;
      p += i + 1;
      value = v;
      return true;
    }
  }
  return false;
}

// A value the scan needs only to step over. Addresses are ten-byte varints, so their end is found a word at a time.
inline bool skip_varint(const uint8_t*& p, const uint8_t* end) {
  if (p < end && *p < 0x80) [[likely]] {
    ++p;
    return true;
  }
  if (end - p < 10) {
    uint64_t ignored = 0;
    return read_varint(p, end, ignored, 10);
  }
  uint64_t word;
  std::memcpy(&word, p, 8);
  const uint64_t stops = ~word & 0x8080808080808080ull;  // bytes without a continuation bit
  const int n = stops ? std::countr_zero(stops) / 8 + 1 : p[8] < 0x80 ? 9 : 10;
  if (p[n - 1] == 0 || (n == 10 && p[9] > 1)) return false;  // padded, or longer than 64 bits
  p += n;
  return true;
}

// kEvent: the top level, where the kind is noted (a template, so that the nested level is compiled without it).
template <bool kEvent>
bool scan_message(const WireMessage& m, const uint8_t* p, const uint8_t* end, int depth, int* kind_case) {
  while (p < end) {
    const WireMessage::Field* field = nullptr;
    if (*p < 0x80) [[likely]] {
      field = &m.by_tag_byte[*p++];
      if (field->wire_type == kNotSure) return false;  // field 0, an unknown field, or another wire type
    } else {
      uint64_t tag = 0;
      if (!read_varint(p, end, tag, 5) || tag > UINT32_MAX) return false;
      if ((tag >> 3) >= m.by_number.size()) return false;  // unknown fields: the full parse keeps them
      field = &m.by_number[tag >> 3];
      if ((tag & 7) != field->wire_type) return false;
    }
    uint64_t length = 0;
    switch (field->wire_type) {
      case 0:
        if (!skip_varint(p, end)) return false;
        break;
      case 1:
        if (end - p < 8) return false;
        p += 8;
        break;
      case 5:
        if (end - p < 4) return false;
        p += 4;
        break;
      case 2:
        if (!read_varint(p, end, length, 10) || length > uint64_t(end - p)) return false;
        if (field->message &&
            (depth >= kMaxDepth || !scan_message<false>(*field->message, p, p + length, depth + 1, nullptr)))
          return false;
        p += length;
        break;
    }
    if constexpr (kEvent) {
      if (field->in_kind) *kind_case = field->number;
    }
  }
  return true;
}

}  // namespace

EventScan scan_event(const uint8_t* data, size_t size) {
  static const WireSchema schema;
  EventScan scan;
  scan.sure = scan_message<true>(schema.event(), data, data + size, 0, &scan.kind_case);
  return scan;
}

}  // namespace deja
