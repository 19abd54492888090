// Signed traces: keys, seals, TRACE.sig, custody and checkpoint signatures, and every tamper case the audit trail
// must refuse (issue 26): each refused with its reason and first bad place, none reported as verified.
#include "logging/custody.h"
#include "logging/evidence_file.h"
#include "logging/signing.h"
#include "logging/trace_signature.h"
#include "logging/trace_verify.h"
#include "trace_test_support.h"

namespace deja::testing {
namespace {

struct Keys {
  SigningKey a = *SigningKey::generate();
  SigningKey b = *SigningKey::generate();
};

const Keys& keys() {
  static const Keys k;
  return k;
}

class SignedTrace : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("t.trace");
    ASSERT_TRUE(write_evidence_file(dir_.file("a.pub"), keys().a.public_key().pem(), "key").has_value());
    ASSERT_TRUE(write_evidence_file(dir_.file("b.pub"), keys().b.public_key().pem(), "key").has_value());
    write_signed(path_, keys().a, 400, 1);
  }

  // A trace sealed every 3 chunks by `key` and signed by it, like `deja record --sign`.
  void write_signed(const std::string& path, const SigningKey& key, size_t events, uint64_t seed) {
    trace::Header h = sample_header();
    h.mutable_signer()->set_key_id(key.id());
    h.mutable_signer()->set_public_key(key.public_key().der());
    auto writer = TraceWriter::create(path, h);
    ASSERT_TRUE(writer.has_value()) << writer.error().message;
    (*writer)->set_chunk_bytes(256);
    ASSERT_TRUE((*writer)->set_sealing(std::make_shared<SigningKey>(key), SealPolicy{std::chrono::nanoseconds(0), 3}));
    for (const auto& e : sample_events(events, seed)) ASSERT_TRUE((*writer)->append(e).has_value());
    ASSERT_TRUE((*writer)->finish(sample_footer(events)).has_value());
    ASSERT_TRUE(sign_finished_trace(**writer, h, sample_footer(events), key).has_value());
  }

  VerifyReport verify(const std::string& path, const std::vector<std::string>& key_files = {"a.pub"}) {
    VerifyOptions options;
    for (const auto& k : key_files) EXPECT_TRUE(options.keys.add_key_file(dir_.file(k)).has_value());
    return verify_trace(path, options);
  }

  // The byte ranges of each frame: {offset, size, magic}.
  struct Frame {
    uint64_t offset, size;
    uint32_t magic;
  };
  std::vector<Frame> frames(const std::string& bytes) {
    std::vector<Frame> out;
    uint64_t header = trace_detail::get_u32(reinterpret_cast<const uint8_t*>(bytes.data()) + 12);
    uint64_t at = 16 + header + 32;
    while (at + kTrailerBytes < bytes.size()) {
      auto* p = reinterpret_cast<const uint8_t*>(bytes.data()) + at;
      uint64_t size = kFrameHeaderBytes + trace_detail::get_u32(p + 4);
      out.push_back({at, size, trace_detail::get_u32(p)});
      at += size;
    }
    return out;
  }

  // A report that must refuse: a reason, a failed check, and no claim of being verified.
  static void expect_refused(const VerifyReport& r, const std::string& what) {
    EXPECT_FALSE(r.ok) << what;
    EXPECT_FALSE(r.first_problem.empty()) << what;
    EXPECT_FALSE(r.failed_check().empty()) << what << ": " << r.summary;
    EXPECT_TRUE(r.summary.starts_with("FAILED")) << what << ": " << r.summary;
    EXPECT_EQ(r.summary.find("VERIFIED"), std::string::npos) << what;
  }

  TempDir dir_;
  std::string path_;
};

TEST_F(SignedTrace, GenuineTraceVerifiesByItsKeyOnly) {
  VerifyReport r = verify(path_);
  ASSERT_TRUE(r.ok) << r.summary;
  EXPECT_EQ(r.authentication, Authentication::kTrusted);
  EXPECT_TRUE(r.summary.starts_with("VERIFIED")) << r.summary;
  EXPECT_TRUE(r.signature_file);
  EXPECT_GT(r.seals, 3u);
  EXPECT_EQ(r.sealed_chunks, r.chunks);
  EXPECT_EQ(r.sealed_events, r.events);

  VerifyReport untrusted = verify_trace(path_);
  ASSERT_TRUE(untrusted.ok) << untrusted.summary;
  EXPECT_EQ(untrusted.authentication, Authentication::kUntrusted);
  EXPECT_TRUE(untrusted.summary.starts_with("OK:")) << untrusted.summary;

  expect_refused(verify(path_, {"b.pub"}), "another trusted key");
  // Both keys trusted: signed by one of them.
  EXPECT_TRUE(verify(path_, {"b.pub", "a.pub"}).ok);
}

TEST_F(SignedTrace, FooterIndexHoldsEveryChunksChainValue) {
  auto reader = TraceReader::open(path_);
  ASSERT_TRUE(reader.has_value());
  auto footer = (*reader)->read_index();
  ASSERT_TRUE(footer.has_value());
  const std::string bytes = read_bytes(path_);
  // Chunk k checks alone: SHA-256(chain of chunk k-1 || its 16 field bytes || payload) is its index entry's chain.
  Sha256 previous = (*reader)->header_sha256();
  for (const auto& entry : footer->chunks()) {
    auto* frame = reinterpret_cast<const uint8_t*>(bytes.data()) + entry.offset();
    uint32_t stored = trace_detail::get_u32(frame + 4);
    Sha256 chain = trace_detail::chain_next(previous, std::span(frame, kFrameFieldBytes),
                                            std::span(frame + kFrameHeaderBytes, stored));
    ASSERT_EQ(entry.chain(), std::string(reinterpret_cast<const char*>(chain.data()), 32));
    previous = chain;
  }
  EXPECT_GT(footer->seals_size(), 3);
}

TEST_F(SignedTrace, UnsignedTraceIsReportedUnsigned) {
  const std::string plain = dir_.file("plain.trace");
  write_trace(plain, sample_events(100));
  VerifyReport r = verify_trace(plain);
  ASSERT_TRUE(r.ok) << r.summary;
  EXPECT_EQ(r.authentication, Authentication::kUnsigned);
  EXPECT_NE(r.summary.find("UNSIGNED"), std::string::npos) << r.summary;
  EXPECT_EQ(r.summary.find("VERIFIED"), std::string::npos);
  VerifyReport keyed = verify(plain);
  expect_refused(keyed, "unsigned with --key");
  EXPECT_EQ(keyed.failed_check(), "signature");
  EXPECT_NE(keyed.first_problem.find("unsigned"), std::string::npos) << keyed.first_problem;
}

TEST_F(SignedTrace, FlippedByteInEachPartIsRefused) {
  const std::string good = read_bytes(path_);
  const auto layout = frames(good);
  const uint64_t header = trace_detail::get_u32(reinterpret_cast<const uint8_t*>(good.data()) + 12);
  std::vector<std::pair<std::string, uint64_t>> places = {
      {"file magic", 0}, {"format version", 8}, {"header length", 12}, {"header", 20}, {"header hash", 16 + header + 5}};
  for (const Frame& f : layout) {
    std::string kind = f.magic == kChunkFrameMagic ? "chunk" : f.magic == kSealFrameMagic ? "seal" : "footer";
    if (places.size() > 40 && kind == "chunk") continue;
    places.push_back({kind + " magic", f.offset});
    places.push_back({kind + " length", f.offset + 5});
    places.push_back({kind + " count", f.offset + 12});
    places.push_back({kind + " chain value", f.offset + 20});
    places.push_back({kind + " payload", f.offset + kFrameHeaderBytes + (f.size - kFrameHeaderBytes) / 2});
  }
  places.push_back({"trailer magic", good.size() - kTrailerBytes});
  places.push_back({"trailer offset", good.size() - kTrailerBytes + 8});
  places.push_back({"trailer chain value", good.size() - kTrailerBytes + 30});
  const std::string bad = dir_.file("bad.trace");
  std::filesystem::copy_file(path_ + ".sig", bad + ".sig");
  for (const auto& [what, at] : places) {
    std::string bytes = good;
    bytes[at] ^= 0x10;
    write_bytes(bad, bytes);
    VerifyReport r = verify(bad);
    expect_refused(r, what);
    if (at >= 16) {
      EXPECT_NE(r.first_problem.find("byte"), std::string::npos) << what << ": " << r.first_problem;
    }
    EXPECT_NE(verify_trace(bad).summary.find("FAILED"), std::string::npos) << what;
  }
  // And in the signature: its payload, its signature.
  const std::string sig = read_bytes(path_ + ".sig");
  write_bytes(bad, good);
  for (size_t at : {sig.find("\"payload\":\"") + 40, sig.find("\"sig\":\"") + 12}) {
    std::string bytes = sig;
    bytes[at] = bytes[at] == 'A' ? 'B' : 'A';
    write_bytes(bad + ".sig", bytes);
    expect_refused(verify(bad), fmt::format("signature byte {}", at));
    expect_refused(verify_trace(bad), fmt::format("signature byte {} without a key", at));
  }
}

TEST_F(SignedTrace, ChunksRemovedReorderedOrDuplicatedAreRefused) {
  const std::string good = read_bytes(path_);
  std::vector<Frame> chunks;
  for (const Frame& f : frames(good))
    if (f.magic == kChunkFrameMagic) chunks.push_back(f);
  ASSERT_GT(chunks.size(), 8u);
  auto piece = [&](const Frame& f) { return good.substr(f.offset, f.size); };
  const Frame& c2 = chunks[3];
  const Frame& c3 = chunks[4];  // adjacent to chunk 3 (seals follow every third chunk: 2, 5, 8, ...)
  ASSERT_EQ(c2.offset + c2.size, c3.offset);
  const std::string head = good.substr(0, c2.offset), tail = good.substr(c3.offset + c3.size);
  const std::string bad = dir_.file("bad.trace");
  std::filesystem::copy_file(path_ + ".sig", bad + ".sig");
  struct Case {
    std::string what, bytes, first_bad;
  };
  for (const Case& c : std::vector<Case>{{"chunk removed", head + piece(c3) + tail, "chunk 3"},
                                          {"chunks reordered", head + piece(c3) + piece(c2) + tail, "chunk 3"},
                                          {"chunk duplicated", head + piece(c2) + piece(c2) + piece(c3) + tail,
                                           "chunk 4"}}) {
    write_bytes(bad, c.bytes);
    VerifyReport r = verify(bad);
    expect_refused(r, c.what);
    EXPECT_EQ(r.failed_check(), "hash chain") << c.what << ": " << r.first_problem;
    EXPECT_NE(r.first_problem.find(c.first_bad + " (byte"), std::string::npos) << c.what << ": " << r.first_problem;
  }
}

TEST_F(SignedTrace, RechainedTraceIsRefused) {
  // Someone rewrites the trace with one event changed: every chain value recomputed, footer and trailer valid.
  auto reader = TraceReader::open(path_);
  ASSERT_TRUE(reader.has_value());
  std::vector<trace::Event> events;
  while (true) {
    auto e = (*reader)->next();
    ASSERT_TRUE(e.has_value());
    if (!*e) break;
    events.push_back(**e);
  }
  events[10].mutable_serial_output()->set_data("forged\n");
  for (bool keep_signer : {true, false}) {
    const std::string bad = dir_.file(keep_signer ? "rechained.trace" : "rechained-unsealed.trace");
    trace::Header h = (*reader)->header();
    if (!keep_signer) h.clear_signer();
    auto writer = TraceWriter::create(bad, h);
    ASSERT_TRUE(writer.has_value());
    (*writer)->set_chunk_bytes(256);
    for (const auto& e : events) ASSERT_TRUE((*writer)->append(e).has_value());
    ASSERT_TRUE((*writer)->finish(sample_footer(events.size())).has_value());
    std::filesystem::copy_file(path_ + ".sig", bad + ".sig");
    EXPECT_TRUE(verify_trace(bad, VerifyOptions{.check_signature_file = false}).complete);  // structurally perfect
    VerifyReport r = verify(bad);
    expect_refused(r, keep_signer ? "re-chained, header kept" : "re-chained, signer removed");
    EXPECT_EQ(r.failed_check(), "signature");
    expect_refused(verify_trace(bad), "re-chained, no key given");
    std::filesystem::remove(bad + ".sig");
    expect_refused(verify(bad), "re-chained without TRACE.sig");
  }
}

TEST_F(SignedTrace, SignatureFromAnotherKeyOrOfAnotherTraceIsRefused) {
  const std::string other = dir_.file("other.trace");
  write_signed(other, keys().a, 300, 7);
  // Another trace's signature, by the right key.
  std::filesystem::copy_file(other + ".sig", path_ + ".sig", std::filesystem::copy_options::overwrite_existing);
  VerifyReport r = verify(path_);
  expect_refused(r, "signature of another trace");
  EXPECT_NE(r.first_problem.find("another file"), std::string::npos) << r.first_problem;
  expect_refused(verify_trace(path_), "signature of another trace, no key");
  // A signature by another key of this very trace (re-signed).
  trace::Header h;
  trace::Footer f;
  auto reader = TraceReader::open(path_);
  h = (*reader)->header();
  f = *(*reader)->read_index();
  TraceFacts facts;
  facts.name = "t.trace";
  facts.file_sha256 = *sha256_file(path_);
  facts.size = (*reader)->file_size();
  facts.header_sha256 = (*reader)->header_sha256();
  VerifyReport plain = verify_trace(path_, VerifyOptions{.check_signature_file = false});
  ASSERT_TRUE(unhex_sha256(plain.final_chain, facts.final_chain));
  ASSERT_TRUE(write_trace_signature(path_, facts, h, f, keys().b).has_value());
  r = verify(path_);
  expect_refused(r, "signature from another key");
  EXPECT_NE(r.first_problem.find("not a trusted key"), std::string::npos) << r.first_problem;
  EXPECT_TRUE(verify(path_, {"b.pub"}).ok);  // which is what the other key's holder would check
}

TEST_F(SignedTrace, TruncatedTraceIsAuthenticatedUpToItsLastSeal) {
  const std::string good = read_bytes(path_);
  const auto layout = frames(good);
  const std::string cut = dir_.file("cut.trace");
  size_t checked = 0;
  for (size_t i = 0; i < layout.size(); i += 3) {
    const Frame& f = layout[i];
    const uint64_t at = f.offset + f.size / 2;  // in the middle of frame i
    write_bytes(cut, good.substr(0, at));
    VerifyReport r = verify(cut);
    expect_refused(r, fmt::format("cut at byte {}", at));
    EXPECT_EQ(r.failed_check(), "structure");
    // The last seal wholly before the cut is where the authenticated part ends.
    uint64_t sealed_bytes = 0;
    for (const Frame& g : layout)
      if (g.magic == kSealFrameMagic && g.offset + g.size <= at) sealed_bytes = g.offset;
    EXPECT_EQ(r.sealed_bytes, sealed_bytes) << "cut at " << at;
    if (sealed_bytes) {
      EXPECT_NE(r.summary.find("authenticate"), std::string::npos) << r.summary;
    }
    ++checked;
  }
  EXPECT_GT(checked, 5u);
}

TEST_F(SignedTrace, ForgedSealIsRefused) {
  const std::string good = read_bytes(path_);
  std::vector<Frame> seals;
  for (const Frame& f : frames(good))
    if (f.magic == kSealFrameMagic) seals.push_back(f);
  ASSERT_GE(seals.size(), 3u);
  const Frame& s = seals[1];
  // A recorder killed after seal 1: the file ends there. The forger claims more events with another key.
  const std::string envelope = good.substr(s.offset + kFrameHeaderBytes, s.size - kFrameHeaderBytes);
  auto genuine = DsseEnvelope::parse(envelope);
  ASSERT_TRUE(genuine.has_value());
  auto claims = parse_seal_payload(genuine->payload);
  ASSERT_TRUE(claims.has_value());
  const std::string cut = dir_.file("forged.trace");
  for (const SigningKey* forger : {&keys().b, &keys().a}) {
    SealClaims forged = *claims;
    if (forger == &keys().a) forged.events += 1;  // the right key, but a signature over other claims: reuse it
    DsseEnvelope fake = DsseEnvelope::sign(*forger, std::string(kSealPayloadType), seal_payload(forged));
    if (forger == &keys().a) fake.signatures = genuine->signatures;
    std::string json = fake.to_json();
    std::string frame = good.substr(s.offset, kFrameHeaderBytes);
    trace_detail::put_u32(reinterpret_cast<uint8_t*>(frame.data()) + 4, uint32_t(json.size()));
    trace_detail::put_u32(reinterpret_cast<uint8_t*>(frame.data()) + 8, uint32_t(json.size()));
    write_bytes(cut, good.substr(0, s.offset) + frame + json);
    VerifyReport r = verify(cut);
    expect_refused(r, "forged seal");
    EXPECT_EQ(r.failed_check(), "structure") << r.summary;  // first: the recording is cut short
    EXPECT_EQ(r.checks[2].status, CheckStatus::kFailed);
    EXPECT_NE(r.checks[2].detail.find(fmt::format("seal 1 at byte {}", s.offset)), std::string::npos)
        << r.checks[2].detail;
    EXPECT_EQ(r.seals, 1u);  // seal 0 still authenticates its prefix
  }
}

TEST_F(SignedTrace, CustodyRecordsChainAndSwappedRecordIsRefused) {
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(add_custody_record(path_, fmt::format("person {}", i), fmt::format("action {}", i), keys().a));
  TrustedKeys trusted;
  ASSERT_TRUE(trusted.add_key_file(dir_.file("a.pub")));
  CustodyReport good = check_custody(path_, trusted);
  ASSERT_TRUE(good.first_problem.empty()) << good.first_problem;
  ASSERT_EQ(good.records.size(), 3u);
  EXPECT_EQ(good.records[2].action, "action 2");

  std::string text = read_bytes(custody_path(path_));
  std::vector<std::string> lines;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    lines.push_back(text.substr(at, end - at + 1));
    at = end + 1;
  }
  write_bytes(custody_path(path_), lines[0] + lines[2] + lines[1]);
  CustodyReport swapped = check_custody(path_, trusted);
  EXPECT_NE(swapped.first_problem.find("custody record 1"), std::string::npos) << swapped.first_problem;
  EXPECT_FALSE(add_custody_record(path_, "x", "y", keys().a).has_value());  // a damaged log is never extended

  write_bytes(custody_path(path_), lines[0] + lines[1]);
  TrustedKeys other;
  ASSERT_TRUE(other.add_key_file(dir_.file("b.pub")));
  EXPECT_NE(check_custody(path_, other).first_problem.find("not a trusted key"), std::string::npos);
  // The trace changed after the records were made.
  std::string trace = read_bytes(path_);
  trace[100] ^= 1;
  write_bytes(path_, trace);
  EXPECT_NE(check_custody(path_, trusted).first_problem.find("changed since"), std::string::npos);
}

TEST_F(SignedTrace, CheckpointSignature) {
  const std::string ckpt = dir_.file("t.trace.0.ckpt");
  write_bytes(ckpt, std::string(1000, 'c'));
  Sha256 header{};
  header[0] = 7;
  ASSERT_TRUE(write_checkpoint_signature(ckpt, header, keys().a));
  EXPECT_TRUE(check_checkpoint_signature(ckpt, header, keys().a.public_key()));
  EXPECT_FALSE(check_checkpoint_signature(ckpt, header, keys().b.public_key()));
  Sha256 other = header;
  other[1] = 1;
  EXPECT_FALSE(check_checkpoint_signature(ckpt, other, keys().a.public_key()));
  write_bytes(ckpt, std::string(999, 'c') + "d");
  auto r = check_checkpoint_signature(ckpt, header, keys().a.public_key());
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("changed after signing"), std::string::npos) << r.error().message;
}

TEST(Signing, DssePaeAndKeyIds) {
  EXPECT_EQ(dsse_pae("http://example.com/HelloWorld", "hello world"),
            "DSSEv1 29 http://example.com/HelloWorld 11 hello world");  // the DSSE specification's example
  const SigningKey& k = keys().a;
  EXPECT_EQ(k.id(), hex(sha256_bytes(std::span(reinterpret_cast<const uint8_t*>(k.public_key().der().data()),
                                               k.public_key().der().size()))));
  DsseEnvelope e = DsseEnvelope::sign(k, "text/plain", "payload");
  auto back = DsseEnvelope::parse(e.to_json());
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->payload, "payload");
  EXPECT_NE(back->signed_by(k.public_key()), nullptr);
  EXPECT_EQ(back->signed_by(keys().b.public_key()), nullptr);
  for (std::string bad : {"", "{}", "[1]", R"({"payloadType":"x","payload":"!!!!","signatures":[]})"})
    EXPECT_FALSE(DsseEnvelope::parse(bad).has_value()) << bad;
  for (size_t n = 0; n < 70; ++n) {
    std::string bytes(n, '\xfe');
    EXPECT_EQ(base64_decode(base64_encode(bytes)).value_or("?"), bytes);
  }
}

TEST(Signing, BadKeysAreRefusedWithTheReason) {
  TempDir dir;
  auto missing = SigningKey::load(dir.file("none"));
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("none"), std::string::npos);
  write_bytes(dir.file("junk"), "not a key");
  EXPECT_FALSE(SigningKey::load(dir.file("junk")));
  write_bytes(dir.file("pub"), keys().a.public_key().pem());
  EXPECT_FALSE(SigningKey::load(dir.file("pub")));  // a public key cannot sign
  write_bytes(dir.file("enc"), "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n");
  auto encrypted = SigningKey::load(dir.file("enc"));
  ASSERT_FALSE(encrypted);
  EXPECT_NE(encrypted.error().message.find("encrypted"), std::string::npos);
  write_bytes(dir.file("priv"), keys().a.private_pem());
  auto loaded = SigningKey::load(dir.file("priv"));
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->id(), keys().a.id());
  auto from_private = VerifyKey::load(dir.file("priv"));
  ASSERT_TRUE(from_private.has_value());
  EXPECT_EQ(from_private->id(), keys().a.id());
}

TEST(EvidenceFile, NeverThroughSymlinksNeverOverAnInputKeysNeverReplaced) {
  TempDir dir;
  const std::string target = dir.file("target");
  write_bytes(target, "precious");
  std::filesystem::create_symlink(target, dir.file("link"));
  EXPECT_FALSE(write_evidence_file(dir.file("link"), "x", "signature"));
  EXPECT_EQ(read_bytes(target), "precious");
  ::link(target.c_str(), dir.file("hard").c_str());
  EXPECT_FALSE(write_evidence_file(dir.file("hard"), "x", "signature", EvidenceFileRules{.inputs = {target}}));
  EXPECT_FALSE(write_evidence_file(target, "x", "key", EvidenceFileRules{.replace = false}));
  EXPECT_EQ(read_bytes(target), "precious");
  ASSERT_TRUE(write_evidence_file(dir.file("new"), "data", "key", EvidenceFileRules{.replace = false}));
  struct stat st {};
  ASSERT_EQ(::stat(dir.file("new").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_FALSE(std::filesystem::exists(dir.file("new.partial")));
  ASSERT_TRUE(write_evidence_file(dir.file("new.pub"), "public", "public key", EvidenceFileRules{.mode = 0644}));
  ASSERT_EQ(::stat(dir.file("new.pub").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
}

}  // namespace
}  // namespace deja::testing
