// verify_trace: one pass through TraceReader (structure, chain) while the file's SHA-256 is computed beside it, then
// the seals, TRACE.sig and its time-stamp, and the input files given.
#include "logging/trace_verify.h"

#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>

#include "core/text.h"
#include "logging/trace_format.h"
#include "logging/trace_reader.h"
#include "logging/trace_signature.h"

namespace deja {

namespace {

std::string hex_of(const Sha256& s) { return hex(std::span(s.data(), s.size())); }

Result<std::string> read_small(const std::string& path, uint64_t limit) {
  std::error_code ec;
  auto size = std::filesystem::file_size(path, ec);
  if (ec) return fail(ErrorKind::kHost, "cannot read {}: {}", path, ec.message());
  if (size > limit) return fail(ErrorKind::kBadTrace, "{} is {} bytes: too large", path, size);
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string coverage(const VerifyReport& r) {
  return fmt::format("the first {} chunk(s): events 0 to {}, bytes 0 to {}", r.sealed_chunks, r.sealed_events - 1,
                     r.sealed_bytes - 1);
}

struct Walk {
  std::string problem;  // the structure or chain problem, "" if none
  TraceCheck check = TraceCheck::kStructure;
  std::string end_reason;  // the last End event's reason
};

// Check 1 and 2: every frame, event and the footer, as the reader checks them (chunks on every core, events scanned),
// plus what a complete recording has.
Walk walk(TraceReader& reader, const VerifyOptions& options) {
  Walk w;
  uint64_t end_events = 0, first_end_index = 0;
  bool last_is_end = false;
  auto tell = [&] {
    if (options.progress) options.progress(reader.valid_bytes(), reader.file_size(), reader.events_read());
  };
  auto scanned = reader.scan([&](const ChunkTally& chunk) {
    const uint64_t first_event = reader.events_read() - chunk.events;
    if (chunk.first_kindless && w.problem.empty())
      w.problem = fmt::format("event {} has no kind (unknown to this deja, or empty)", first_event + *chunk.first_kindless);
    for (const auto& [at, reason] : chunk.ends) {
      if (end_events++ == 0) first_end_index = first_event + at;
      w.end_reason = reason;
    }
    if (chunk.events > 0) last_is_end = !chunk.ends.empty() && chunk.ends.back().first == chunk.events - 1;
    tell();
  });
  if (!scanned) {
    w.problem = scanned.error().message;
    w.check = reader.failed_check();
    return w;
  }
  tell();
  if (!w.problem.empty()) return w;
  if (reader.truncated()) {
    w.problem = reader.end_description();
  } else if (!last_is_end) {
    w.problem = end_events == 0 ? "the trace has no End event (the recording did not finish cleanly)"
                                : fmt::format("event {} is an End event but events follow it", first_end_index);
  } else if (end_events > 1) {
    w.problem = fmt::format("{} End events; the first is event {} (only one, the last, is allowed)", end_events,
                            first_end_index);
  } else {
    for (const auto& input : reader.header().inputs()) {
      if (!input.sha256().empty() && input.sha256().size() != 32) {
        w.problem = fmt::format("header input {} ({}) has a {}-byte SHA-256, not 32", printable(input.path()), printable(input.role()),
                                input.sha256().size());
        break;
      }
    }
  }
  return w;
}

// The seal frames, in order, against the header's signer: sets the sealed coverage, returns the first problem.
std::string check_seals(const TraceReader& reader, const VerifyKey* signer, VerifyReport& report) {
  const auto& seals = reader.seals();
  for (size_t i = 0; i < seals.size(); ++i) {
    const SealFrame& seal = seals[i];
    auto where = [&](std::string what) { return fmt::format("seal {} at byte {}: {}", i, seal.offset, what); };
    if (signer == nullptr) return where("a seal in a trace whose header names no signer");
    auto envelope = DsseEnvelope::parse(seal.envelope);
    if (!envelope) return where(envelope.error().message);
    if (envelope->payload_type != kSealPayloadType) return where("not a seal (payload type " + printable(envelope->payload_type) + ")");
    if (!envelope->signed_by(*signer))
      return where(fmt::format("the signature does not verify under the signer's key {} (a forged or altered seal)",
                               signer->short_id()));
    auto claims = parse_seal_payload(envelope->payload);
    if (!claims) return where(claims.error().message);
    if (claims->sequence != i || claims->chunks != seal.chunks || claims->events != seal.events ||
        claims->end_offset != seal.offset || claims->chain != seal.chain ||
        claims->header_sha256 != reader.header_sha256())
      return where(fmt::format("it seals seal {} after {} chunks and {} events ending at byte {}, but it is seal {} "
                               "after {} chunks and {} events at byte {} (a seal moved from elsewhere)",
                               claims->sequence, claims->chunks, claims->events, claims->end_offset, i, seal.chunks,
                               seal.events, seal.offset));
    report.seals = i + 1;
    report.sealed_chunks = seal.chunks;
    report.sealed_events = seal.events;
    report.sealed_bytes = seal.offset;
  }
  return {};
}

// A key's name for reports: the trusted key's ("alice (3f2a...)"), else "key 3f2a...".
std::string who_is(const VerifyKey& key, const TrustedKeys& keys) {
  const VerifyKey* trusted = keys.find(key.id());
  return trusted ? fmt::format("{} ({})", trusted->name(), trusted->short_id()) : "key " + key.short_id();
}

// TRACE.sig against the file: returns the first problem; `signer` is set to the key whose signature verified (the
// statement's own key when no trusted key signed), and the time-stamp goes into `report`.
std::string check_signature_file(const std::string& sig_path, const TraceReader& reader, const std::string& file_sha256,
                                 const VerifyOptions& options, VerifyReport& report, std::optional<VerifyKey>& signer,
                                 std::string& note) {
  auto text = read_small(sig_path, 16u << 20);
  if (!text) return text.error().message;
  auto envelope = DsseEnvelope::parse(*text);
  if (!envelope) return fmt::format("{}: {}", sig_path, envelope.error().message);
  if (envelope->payload_type != kInTotoPayloadType)
    return fmt::format("{}: payload type {} is not an in-toto statement", sig_path, printable(envelope->payload_type));
  auto statement = parse_statement(envelope->payload);
  if (!statement) return fmt::format("{}: {}", sig_path, statement.error().message);
  if (statement->predicate_type != kRecordingPredicateType)
    return fmt::format("{}: the statement is not about a recording (predicate type {})", sig_path,
                       printable(statement->predicate_type));
  // A trusted key that signed it; else the key the statement names (which only shows the file is unaltered).
  const DsseSignature* good = nullptr;
  for (const DsseSignature& s : envelope->signatures) {
    if (const VerifyKey* key = options.keys.find(s.keyid)) {
      if (!key->verify(dsse_pae(envelope->payload_type, envelope->payload), s.sig))
        return fmt::format("{}: the signature by {} does not verify: the statement or the signature was altered",
                           sig_path, key->name());
      good = &s;
      signer = *key;
      break;
    }
  }
  if (!good) {
    auto key = VerifyKey::from_der(statement->signer_public_key);
    if (!key) return fmt::format("{}: the statement names no usable signer key", sig_path);
    good = envelope->signed_by(*key);
    if (!good) return fmt::format("{}: the signature does not verify under the key the statement names ({}): the "
                                  "statement or the signature was altered", sig_path, key->short_id());
    signer = *key;
  }
  if (statement->subject_sha256 != file_sha256)
    return fmt::format("{} is a signature of another file: its subject's SHA-256 is {}, this trace's is {}", sig_path,
                       printable(statement->subject_sha256), file_sha256);
  if (statement->header_sha256 != hex_of(reader.header_sha256()) ||
      statement->final_chain != hex_of(reader.chain_value()))
    return fmt::format("{}: the statement's header hash or final chain value is not this trace's", sig_path);
  note = fmt::format("{} signed by {} at {}", std::filesystem::path(sig_path).filename().string(),
                     who_is(*signer, options.keys), printable(statement->signed_at));

  const std::string tsr = timestamp_path(sig_path);
  if (std::filesystem::exists(tsr)) {
    auto response = read_small(tsr, 1u << 20);
    if (!response) return response.error().message;
    auto stamp = check_timestamp(*response, good->sig, options.tsa_ca);
    if (!stamp) return fmt::format("{}: {}", tsr, stamp.error().message);
    report.timestamp = *stamp;
    note += fmt::format("; time-stamped {} by {}{}", stamp->time, printable(stamp->authority),
                        stamp->authority_checked ? " (checked against " + options.tsa_ca + ")"
                                                 : " (authority not checked: give --tsa-ca)");
  } else if (!options.tsa_ca.empty()) {
    return fmt::format("--tsa-ca was given but there is no time-stamp ({})", tsr);
  }
  return {};
}

// Check 4: each file given must be one of the recorded inputs.
CheckResult check_inputs(const trace::Header& h, const std::vector<std::string>& files) {
  CheckResult c{"inputs", CheckStatus::kNotRun, {}};
  size_t recorded = size_t(h.inputs_size());
  for (const auto& d : h.config().disks()) recorded += d.sha256().size() == 32 ? 1 : 0;
  if (files.empty()) {
    c.detail = fmt::format("not checked: {} recorded input file(s); give them with --input FILE", recorded);
    return c;
  }
  std::vector<std::string> matched;
  for (const std::string& file : files) {
    auto sum = sha256_file(file);
    if (!sum) {
      c.status = CheckStatus::kFailed;
      c.detail = sum.error().message;
      return c;
    }
    const std::string digest(reinterpret_cast<const char*>(sum->data()), sum->size());
    std::string which;
    for (const auto& in : h.inputs())
      if (which.empty() && in.sha256() == digest) which = fmt::format("{} {}", in.role(), in.path());
    for (const auto& d : h.config().disks())
      if (which.empty() && d.sha256() == digest) which = fmt::format("disk {}", d.path());
    if (which.empty()) {
      c.status = CheckStatus::kFailed;
      c.detail = fmt::format("{} (SHA-256 {}) is none of the recorded inputs", file, hex_of(*sum));
      return c;
    }
    matched.push_back(fmt::format("{} is the recorded {}", file, which));
  }
  c.status = CheckStatus::kPassed;
  for (const auto& m : matched) c.detail += (c.detail.empty() ? "" : "; ") + m;
  return c;
}

}  // namespace

std::string VerifyReport::failed_check() const {
  for (const CheckResult& c : checks)
    if (c.status == CheckStatus::kFailed) return c.name;
  return {};
}

VerifyReport verify_trace(const std::string& path, const VerifyOptions& options) {
  VerifyReport report;
  report.checks = {{"structure", CheckStatus::kNotRun, {}},
                   {"hash chain", CheckStatus::kNotRun, {}},
                   {"signature", CheckStatus::kNotRun, {}},
                   {"inputs", CheckStatus::kNotRun, {}}};
  CheckResult& structure = report.checks[0];
  CheckResult& chain = report.checks[1];
  CheckResult& signature = report.checks[2];
  auto opened = TraceReader::open(path);
  if (!opened) {
    report.first_problem = opened.error().message;
    structure = {"structure", CheckStatus::kFailed, report.first_problem};
    report.summary = fmt::format("FAILED (structure): {}", report.first_problem);
    return report;
  }
  TraceReader& reader = **opened;
  report.opened = true;
  const trace::Header& h = reader.header();
  report.header_sha256 = hex_of(reader.header_sha256());

  // The whole file's SHA-256, for the signature's subject, on the other core while the chain is walked.
  const std::string sig_path = options.signature.empty() ? signature_path(path) : options.signature;
  const bool has_signature_file = options.check_signature_file && std::filesystem::exists(sig_path);
  std::future<Result<Sha256>> file_hash;
  if (has_signature_file) file_hash = std::async(std::launch::async, [path] { return sha256_file(path); });

  Walk w = walk(reader, options);
  report.chunks = reader.chunks_read();
  report.events = reader.events_read();
  report.complete = reader.complete();
  if (report.complete) report.final_chain = hex_of(reader.chain_value());
  const std::string where = fmt::format("{} chunks and {} events verified before that (valid through byte {} of {})",
                                        report.chunks, report.events, reader.valid_bytes(), reader.file_size());
  if (!w.problem.empty() && w.check == TraceCheck::kChain) {
    structure = {"structure", CheckStatus::kPassed, "frames well-formed up to the chain failure"};
    chain = {"hash chain", CheckStatus::kFailed, w.problem + "; " + where};
  } else if (!w.problem.empty()) {
    structure = {"structure", CheckStatus::kFailed, w.problem + "; " + where};
  } else {
    structure = {"structure", CheckStatus::kPassed,
                 fmt::format("format v{}, {} chunks, {} events, {} seal frames, footer and trailer, {} bytes",
                             h.format_version(), report.chunks, report.events, reader.seals().size(),
                             reader.file_size())};
    chain = {"hash chain", CheckStatus::kPassed,
             fmt::format("header {}..., final chain value {}...", report.header_sha256.substr(0, 16),
                         report.final_chain.substr(0, 16))};
  }

  // Check 3: the seals (as far as they go: a cut or damaged trace says how far it is authenticated) under the key
  // the header names, then TRACE.sig; then whether a trusted key stands behind the whole.
  std::optional<VerifyKey> sealer;
  std::string problem;
  if (h.has_signer()) {
    auto key = VerifyKey::from_der(h.signer().public_key());
    if (!key || key->id() != h.signer().key_id()) problem = "the header's signer key is malformed";
    else sealer = *key;
  }
  if (problem.empty()) problem = check_seals(reader, sealer ? &*sealer : nullptr, report);
  std::vector<std::string> notes;
  if (problem.empty() && sealer) {
    report.signer = who_is(*sealer, options.keys);
    if (report.seals == 0) notes.push_back("sealed by " + report.signer + ", but no seal was written yet: nothing "
                                           "of it is authenticated");
    else notes.push_back(fmt::format("{} seals by {} authenticate {}", report.seals, report.signer, coverage(report)));
    if (report.complete && report.sealed_chunks != report.chunks)
      problem = fmt::format("the seals stop after chunk {} but the trace has {} chunks: chunks were added after the "
                            "last seal (a re-chained trace)", report.sealed_chunks, report.chunks);
  }
  std::string file_sha;
  if (file_hash.valid()) {
    if (auto sum = file_hash.get()) file_sha = hex_of(*sum);
    else if (problem.empty()) problem = sum.error().message;
    report.file_sha256 = file_sha;
  }
  std::optional<VerifyKey> sig_signer;
  if (problem.empty() && has_signature_file) {
    std::string note;
    problem = check_signature_file(sig_path, reader, file_sha, options, report, sig_signer, note);
    if (problem.empty()) {
      report.signature_file = true;
      notes.push_back(note);
    }
  }
  // With trusted keys given, TRACE.sig (which covers every byte) must be by one of them; without TRACE.sig, the
  // seals must be. Without keys, a signature only shows that no one without the named key altered the file.
  const bool seals_trusted = sealer && options.keys.find(sealer->id());
  const bool sig_trusted = sig_signer && options.keys.find(sig_signer->id());
  std::string trusted_by;
  if (problem.empty() && !options.keys.empty()) {
    if (report.signature_file && !sig_trusted)
      problem = fmt::format("{} is signed by {}, which is not a trusted key ({})", sig_path,
                            who_is(*sig_signer, options.keys), options.keys.describe());
    else if (!report.signature_file && sealer && !seals_trusted)
      problem = fmt::format("the trace is sealed by {}, which is not a trusted key ({})", report.signer,
                            options.keys.describe());
    else if (!report.signature_file && !sealer)
      problem = fmt::format("the trace is unsigned (no {} and no seals): nothing to check {} against", sig_path,
                            options.keys.describe());
    else if (sig_trusted)
      trusted_by = "signed by " + who_is(*sig_signer, options.keys);
    else
      trusted_by = "sealed by " + report.signer;
  }
  if (problem.empty() && !trusted_by.empty()) {
    report.authentication = Authentication::kTrusted;
    if (sig_trusted) report.signer = who_is(*sig_signer, options.keys);
  } else if (problem.empty() && (sealer || sig_signer)) {
    report.authentication = Authentication::kUntrusted;
    if (sig_signer) report.signer = who_is(*sig_signer, options.keys);
  } else if (problem.empty()) {
    notes.push_back(fmt::format("UNSIGNED: no {} and no seals; the hash chain shows integrity, not who wrote it",
                                sig_path));
  }
  if (!problem.empty()) {
    signature = {"signature", CheckStatus::kFailed, problem};
    if (report.seals > 0) signature.detail += fmt::format("; {} good seals before that authenticate {}", report.seals,
                                                          coverage(report));
  } else {
    signature.status = CheckStatus::kPassed;
    for (const auto& n : notes) signature.detail += (signature.detail.empty() ? "" : "; ") + n;
    if (sealer && report.complete && !report.signature_file)
      signature.detail += fmt::format("; no {}: the footer (summary figures) is not signed", sig_path);
  }
  // A damaged unsigned trace: nothing to say about signatures; the first failure is the earlier check's.
  if ((structure.status == CheckStatus::kFailed || chain.status == CheckStatus::kFailed) && !sealer &&
      !has_signature_file && signature.status == CheckStatus::kPassed)
    signature.status = CheckStatus::kNotRun;

  report.checks[3] = check_inputs(h, options.inputs);

  report.first_problem.clear();
  for (const CheckResult& c : report.checks)
    if (c.status == CheckStatus::kFailed && report.first_problem.empty()) report.first_problem = c.detail;
  report.ok = report.first_problem.empty() && report.complete;
  if (report.ok) {
    std::string who = report.authentication == Authentication::kTrusted ? "VERIFIED" : "OK";
    std::string signed_by =
        report.authentication == Authentication::kTrusted    ? trusted_by
        : report.authentication == Authentication::kUntrusted ? fmt::format("signed by {}, a key no --key or --keyring "
                                                                            "vouches for", report.signer)
                                                              : std::string("UNSIGNED (integrity only)");
    report.summary = fmt::format(
        "{}: {} is complete and its hash chain intact, {}: format v{}, {} chunks, {} events, {} bytes; recorded by "
        "deja {} (build {}), cpu model {} v{}, device model v{}, {} input file(s)",
        who, printable(path), signed_by, h.format_version(), report.chunks, report.events, reader.file_size(),
        printable(h.deja_version()), printable(h.build_id()), h.cpu_model().empty() ? "deja-v1" : printable(h.cpu_model()),
        h.cpu_model_version(),
        h.device_model_version(), h.inputs_size());
    // Complete, but of a run that a host failure cut short (a disk overlay or the serial output could not be
    // written): it replays to where it stopped, and says so.
    if (w.end_reason.starts_with(kHostFailureReason)) report.summary += "; the recording was " + printable(w.end_reason);
  } else {
    report.summary = fmt::format("FAILED ({}): {}", report.failed_check(), report.first_problem);
    if (report.seals > 0 && report.failed_check() != "signature")
      report.summary += fmt::format("; the seals by {} authenticate {}", report.signer.empty() ? "its signer" : report.signer,
                                    coverage(report));
  }
  return report;
}

std::string describe_checks(const VerifyReport& report) {
  std::string out = report.summary + "\n";
  int n = 0;
  for (const CheckResult& c : report.checks) {
    const char* status = c.status == CheckStatus::kPassed ? "ok" : c.status == CheckStatus::kFailed ? "FAILED" : "-";
    out += fmt::format("  {} {:<11} {:<6} {}\n", ++n, c.name, status, c.detail);
  }
  return out;
}

}  // namespace deja
