// big_trace: a large signed trace for bench/audit_bench.py: a recording's events repeated until OUT has BYTES bytes
// (its End event once, last), sealed every SEAL_CHUNKS chunks and signed by KEY, as `deja record --sign` would.
//
//   big_trace IN OUT BYTES KEY [SEAL_CHUNKS]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "logging/signing.h"
#include "logging/trace_reader.h"
#include "logging/trace_signature.h"
#include "logging/trace_writer.h"

int main(int argc, char** argv) {
  using namespace deja;
  if (argc < 5) {
    std::fprintf(stderr, "usage: big_trace IN OUT BYTES KEY [SEAL_CHUNKS]\n");
    return 2;
  }
  const uint64_t target = std::strtoull(argv[3], nullptr, 10);
  auto key = SigningKey::load(argv[4]);
  auto reader = TraceReader::open(argv[1]);
  if (!key || !reader) {
    std::fprintf(stderr, "big_trace: %s\n", (!key ? key.error() : reader.error()).message.c_str());
    return 1;
  }
  std::vector<trace::Event> events;
  trace::Event end;
  while (true) {
    auto e = (*reader)->next();
    if (!e || !*e) break;
    if ((*e)->has_end()) end = **e;
    else events.push_back(std::move(**e));
  }
  trace::Header header = (*reader)->header();
  header.mutable_signer()->set_key_id(key->id());
  header.mutable_signer()->set_public_key(key->public_key().der());
  auto writer = TraceWriter::create(argv[2], header);
  if (!writer) {
    std::fprintf(stderr, "big_trace: %s\n", writer.error().message.c_str());
    return 1;
  }
  auto shared = std::make_shared<SigningKey>(*key);
  (void)(*writer)->set_sealing(shared, SealPolicy{std::chrono::seconds(10), argc > 5 ? std::strtoull(argv[5], nullptr, 10) : 0});
  while ((*writer)->bytes_written() < target) {
    for (const auto& e : events) (void)(*writer)->append(e);
  }
  (void)(*writer)->append(end);
  trace::Footer footer = (*reader)->footer() ? *(*reader)->footer() : trace::Footer{};
  if (auto r = (*writer)->finish(footer); !r) {
    std::fprintf(stderr, "big_trace: %s\n", r.error().message.c_str());
    return 1;
  }
  if (auto r = sign_finished_trace(**writer, header, footer, *key); !r) {
    std::fprintf(stderr, "big_trace: %s\n", r.error().message.c_str());
    return 1;
  }
  std::printf("%llu bytes, %llu events, %llu seals\n", (unsigned long long)(*writer)->bytes_written(),
              (unsigned long long)(*writer)->events_written(), (unsigned long long)(*writer)->seals_written());
  return 0;
}
