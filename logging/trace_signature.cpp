// Seal claims and in-toto statements as JSON (nlohmann::json), TRACE.sig and checkpoint signatures.
#include "logging/trace_signature.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <google/protobuf/util/json_util.h>
#include <nlohmann/json.hpp>

#include "logging/evidence_file.h"
#include "logging/trace_writer.h"

namespace deja {

namespace {

using Json = nlohmann::ordered_json;

std::string hex_of(const Sha256& s) { return hex(std::span(s.data(), s.size())); }

// A message as protobuf's JSON mapping (field names as in trace.proto), as a JSON value.
Json proto_json(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string text;
  if (!google::protobuf::util::MessageToJsonString(m, &text, options).ok()) return nullptr;
  return Json::parse(text, nullptr, false);
}

// The text at `key` of object `j`, or "" when absent or not a string.
std::string text_at(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return {};
  return j[key].get<std::string>();
}

Result<std::string> read_file(const std::string& path, std::string_view what, uint64_t limit) {
  std::error_code ec;
  auto size = std::filesystem::file_size(path, ec);
  if (ec) return fail(ErrorKind::kInvalidArgument, "cannot read {} {}: {}", what, path, ec.message());
  if (size > limit) return fail(ErrorKind::kBadTrace, "{} {} is {} bytes, more than one can be", what, path, size);
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  if (!in && !in.eof()) return fail(ErrorKind::kHost, "cannot read {} {}", what, path);
  return s.str();
}

Json signer_json(const VerifyKey& signer) {
  return Json{{"key_id", signer.id()}, {"public_key", base64_encode(signer.der())}};
}

}  // namespace

std::string seal_payload(const SealClaims& c) {
  Json j;
  j["sequence"] = c.sequence;
  j["chunks"] = c.chunks;
  j["events"] = c.events;
  j["end_offset"] = c.end_offset;
  j["chain"] = hex_of(c.chain);
  j["header_sha256"] = hex_of(c.header_sha256);
  j["sealed_at"] = rfc3339_utc(c.sealed_at_unix_ns);
  j["sealed_at_unix_ns"] = c.sealed_at_unix_ns;
  return j.dump();
}

Result<SealClaims> parse_seal_payload(std::string_view payload) {
  auto j = nlohmann::json::parse(payload, nullptr, false);
  auto number = [&](const char* key, uint64_t& out) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_number_unsigned()) return false;
    out = j[key].get<uint64_t>();
    return true;
  };
  SealClaims c;
  uint64_t when = 0;
  if (!number("sequence", c.sequence) || !number("chunks", c.chunks) || !number("events", c.events) ||
      !number("end_offset", c.end_offset) || !unhex_sha256(text_at(j, "chain"), c.chain) ||
      !unhex_sha256(text_at(j, "header_sha256"), c.header_sha256))
    return fail(ErrorKind::kBadTrace, "the seal's payload is not a deja seal (JSON with sequence, chunks, events, "
                "end_offset, chain, header_sha256)");
  if (number("sealed_at_unix_ns", when)) c.sealed_at_unix_ns = int64_t(when);
  return c;
}

std::string recording_statement(const TraceFacts& facts, const trace::Header& header, const trace::Footer& footer,
                                const VerifyKey& signer, int64_t signed_at_unix_ns) {
  Json inputs = Json::array();
  for (const auto& in : header.inputs())
    inputs.push_back({{"role", in.role()}, {"path", in.path()}, {"size", in.size()}, {"sha256", hex(in.sha256())}});
  for (const auto& d : header.config().disks()) {
    Json disk{{"role", "disk"}, {"path", d.path()}, {"size", d.size()}};
    if (d.hash_block()) disk["hash_block"] = d.hash_block();  // lazy: blocks hashed in the trace as the guest read them
    else disk["sha256"] = hex(d.sha256());
    inputs.push_back(disk);
  }
  Json predicate;
  predicate["trace"] = {{"format_version", header.format_version()},
                        {"size", facts.size},
                        {"header_sha256", hex_of(facts.header_sha256)},
                        {"final_chain", hex_of(facts.final_chain)},
                        {"chunks", facts.chunks},
                        {"events", facts.events},
                        {"seals", facts.seals}};
  predicate["recorder"] = {{"name", "deja"}, {"version", header.deja_version()}, {"build_id", header.build_id()}};
  predicate["machine"] = {{"cpu_model", header.cpu_model().empty() ? "deja-v1" : header.cpu_model()},
                          {"cpu_model_version", header.cpu_model_version()},
                          {"device_model_version", header.device_model_version()},
                          {"config", proto_json(header.config())}};
  predicate["inputs"] = inputs;
  predicate["host"] = header.host();
  predicate["started_at"] = rfc3339_utc(header.start_unix_ns());
  predicate["ended_at"] = rfc3339_utc(header.start_unix_ns() + int64_t(footer.wall_ns()));
  predicate["outcome"] = {{"exit_status", footer.exit_status()},
                          {"instructions", footer.instructions()},
                          {"final_digest", hex(footer.final_digest())}};
  predicate["signer"] = signer_json(signer);
  predicate["signed_at"] = rfc3339_utc(signed_at_unix_ns);

  Json statement;
  statement["_type"] = kInTotoStatementType;
  statement["subject"] = Json::array({{{"name", facts.name}, {"digest", {{"sha256", hex_of(facts.file_sha256)}}}}});
  statement["predicateType"] = kRecordingPredicateType;
  statement["predicate"] = predicate;
  return statement.dump();
}

Result<Statement> parse_statement(std::string_view payload) {
  auto bad = [](std::string what) { return std::unexpected(Error{ErrorKind::kBadTrace, "not an in-toto statement: " + what}); };
  auto j = nlohmann::json::parse(payload, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bad("the payload is not a JSON object");
  if (text_at(j, "_type") != kInTotoStatementType) return bad(fmt::format("_type is not {}", kInTotoStatementType));
  if (!j.contains("subject") || !j["subject"].is_array() || j["subject"].size() != 1)
    return bad("it must have exactly one subject");
  const auto& subject = j["subject"][0];
  Statement s;
  s.subject_name = text_at(subject, "name");
  if (subject.is_object() && subject.contains("digest")) s.subject_sha256 = text_at(subject["digest"], "sha256");
  if (s.subject_sha256.size() != 64) return bad("the subject has no sha256 digest");
  s.predicate_type = text_at(j, "predicateType");
  if (!j.contains("predicate") || !j["predicate"].is_object()) return bad("no predicate");
  const auto& p = j["predicate"];
  s.predicate_json = p.dump();
  if (p.contains("signer")) {
    s.signer_key_id = text_at(p["signer"], "key_id");
    if (auto der = base64_decode(text_at(p["signer"], "public_key"))) s.signer_public_key = *der;
  }
  s.signed_at = text_at(p, "signed_at");
  if (p.contains("trace")) {
    s.header_sha256 = text_at(p["trace"], "header_sha256");
    s.final_chain = text_at(p["trace"], "final_chain");
  }
  return s;
}

Result<DsseEnvelope> write_trace_signature(const std::string& trace_path, const TraceFacts& facts,
                                           const trace::Header& header, const trace::Footer& footer,
                                           const SigningKey& key) {
  std::string statement = recording_statement(facts, header, footer, key.public_key(), now_unix_ns());
  DsseEnvelope envelope = DsseEnvelope::sign(key, std::string(kInTotoPayloadType), std::move(statement));
  if (auto r = write_evidence_file(signature_path(trace_path), envelope.to_json() + "\n", "signature",
                                   EvidenceFileRules{.inputs = {trace_path}});
      !r)
    return std::unexpected(r.error());
  return envelope;
}

Result<DsseEnvelope> sign_finished_trace(const TraceWriter& writer, const trace::Header& header,
                                         const trace::Footer& footer, const SigningKey& key) {
  if (!writer.file_sha256())
    return fail(ErrorKind::kInvalidArgument, "trace {} is not finished: nothing to sign", writer.path());
  TraceFacts facts;
  facts.name = std::filesystem::path(writer.path()).filename().string();
  facts.file_sha256 = *writer.file_sha256();
  facts.size = writer.bytes_written();
  facts.header_sha256 = writer.header_sha256();
  facts.final_chain = writer.chain_value();
  facts.chunks = writer.chunks_written();
  facts.events = writer.events_written();
  facts.seals = writer.seals_written();
  trace::Header stated = header;
  stated.set_format_version(kTraceFormatVersion);  // as the writer stamps it
  return write_trace_signature(writer.path(), facts, stated, footer, key);
}

std::optional<VerifyKey> trace_signer(const std::string& trace_path, const trace::Header& header) {
  if (header.has_signer()) {
    if (auto key = VerifyKey::from_der(header.signer().public_key())) return *key;
  }
  auto text = read_file(signature_path(trace_path), "signature", 16u << 20);
  if (!text) return std::nullopt;
  auto envelope = DsseEnvelope::parse(*text);
  if (!envelope) return std::nullopt;
  auto statement = parse_statement(envelope->payload);
  if (!statement) return std::nullopt;
  auto key = VerifyKey::from_der(statement->signer_public_key);
  if (!key || !envelope->signed_by(*key)) return std::nullopt;
  return *key;
}

Result<> write_checkpoint_signature(const std::string& checkpoint_path, const Sha256& trace_header_sha256,
                                    const SigningKey& key) {
  auto sum = sha256_file(checkpoint_path);
  if (!sum) return std::unexpected(sum.error());
  Json statement;
  statement["_type"] = kInTotoStatementType;
  statement["subject"] = Json::array({{{"name", std::filesystem::path(checkpoint_path).filename().string()},
                                       {"digest", {{"sha256", hex_of(*sum)}}}}});
  statement["predicateType"] = kCheckpointPredicateType;
  statement["predicate"] = {{"trace", {{"header_sha256", hex_of(trace_header_sha256)}}},
                            {"signer", signer_json(key.public_key())},
                            {"signed_at", rfc3339_utc(now_unix_ns())}};
  DsseEnvelope envelope = DsseEnvelope::sign(key, std::string(kInTotoPayloadType), statement.dump());
  return write_evidence_file(checkpoint_path + ".sig", envelope.to_json() + "\n", "checkpoint signature",
                             EvidenceFileRules{.inputs = {checkpoint_path}});
}

Result<> check_checkpoint_signature(const std::string& checkpoint_path, const Sha256& trace_header_sha256,
                                    const VerifyKey& key) {
  const std::string sig_path = checkpoint_path + ".sig";
  if (!std::filesystem::exists(sig_path))
    return fail(ErrorKind::kBadTrace, "it is not signed (no {}), and the trace is", sig_path);
  auto text = read_file(sig_path, "checkpoint signature", 1 << 20);
  if (!text) return std::unexpected(text.error());
  auto envelope = DsseEnvelope::parse(*text);
  if (!envelope) return fail(ErrorKind::kBadTrace, "{}: {}", sig_path, envelope.error().message);
  if (envelope->payload_type != kInTotoPayloadType || !envelope->signed_by(key))
    return fail(ErrorKind::kBadTrace, "{} is not a signature by the trace's signer {} ({})", sig_path, key.name(),
                key.short_id());
  auto statement = parse_statement(envelope->payload);
  if (!statement) return fail(ErrorKind::kBadTrace, "{}: {}", sig_path, statement.error().message);
  if (statement->predicate_type != kCheckpointPredicateType)
    return fail(ErrorKind::kBadTrace, "{} does not sign a checkpoint", sig_path);
  auto sum = sha256_file(checkpoint_path);
  if (!sum) return std::unexpected(sum.error());
  if (statement->subject_sha256 != hex_of(*sum))
    return fail(ErrorKind::kBadTrace, "the file's SHA-256 {} is not the signed one {}: it was changed after signing",
                hex_of(*sum), statement->subject_sha256);
  auto predicate = nlohmann::json::parse(statement->predicate_json, nullptr, false);
  std::string header = predicate.contains("trace") ? text_at(predicate["trace"], "header_sha256") : std::string();
  if (header != hex_of(trace_header_sha256))
    return fail(ErrorKind::kBadTrace, "{} signs a checkpoint of another trace", sig_path);
  return {};
}

}  // namespace deja
