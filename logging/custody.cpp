// TRACE.custody: JSON Lines of DSSE envelopes, each payload a custody record hash-chained to the line before it.
#include "logging/custody.h"

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/text.h"
#include "logging/evidence_file.h"
#include "logging/trace_format.h"

namespace deja {

namespace {

std::string sha256_hex(std::string_view bytes) {
  return hex(sha256_bytes(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size())));
}

std::string text_at(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return {};
  return j[key].get<std::string>();
}

// The lines of TRACE.custody ("" content: none); a file that is not a regular file or is huge is an error.
Result<std::vector<std::string>> read_lines(const std::string& path, bool& exists) {
  std::error_code ec;
  exists = false;
  auto status = std::filesystem::symlink_status(path, ec);
  if (ec || status.type() == std::filesystem::file_type::not_found) return std::vector<std::string>{};
  exists = true;
  if (status.type() != std::filesystem::file_type::regular)
    return fail(ErrorKind::kBadTrace, "custody log {} is not a regular file", path);
  if (std::filesystem::file_size(path, ec) > (64u << 20))
    return fail(ErrorKind::kBadTrace, "custody log {} is over 64 MiB", path);
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  if (!text.empty() && text.back() != '\n')
    return fail(ErrorKind::kBadTrace, "custody log {} does not end with a newline (its last record is cut short)", path);
  std::vector<std::string> lines;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    lines.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return lines;
}

CustodyReport check_lines(const std::vector<std::string>& lines, const TrustedKeys& keys, const std::string& trace_sha) {
  CustodyReport report;
  report.trace_sha256 = trace_sha;
  report.trusted = !keys.empty();
  for (size_t i = 0; i < lines.size(); ++i) {
    CustodyRecord r;
    auto problem = [&](std::string what) {
      r.problem = std::move(what);
      report.first_problem = fmt::format("custody record {}: {}", i, r.problem);
      report.records.push_back(r);
      return report;
    };
    auto envelope = DsseEnvelope::parse(lines[i]);
    if (!envelope) return problem(envelope.error().message);
    if (envelope->payload_type != kCustodyPayloadType || envelope->signatures.empty())
      return problem("not a signed custody record");
    auto j = nlohmann::json::parse(envelope->payload, nullptr, false);
    if (!j.is_object() || !j.contains("sequence") || !j["sequence"].is_number_unsigned())
      return problem("its payload is not a custody record");
    r.sequence = j["sequence"].get<uint64_t>();
    r.time = text_at(j, "time");
    r.by = text_at(j, "by");
    r.action = text_at(j, "action");
    if (j.contains("trace")) r.trace_sha256 = text_at(j["trace"], "sha256");
    r.previous = text_at(j, "previous");
    std::string public_key;
    if (j.contains("signer")) {
      r.key_id = text_at(j["signer"], "key_id");
      if (auto der = base64_decode(text_at(j["signer"], "public_key"))) public_key = *der;
    }
    // Whose signature: a trusted key's, or (none given) the key the record names.
    std::optional<VerifyKey> named;
    const VerifyKey* key = nullptr;
    if (!keys.empty()) {
      key = keys.find(r.key_id);
      if (!key) return problem(fmt::format("signed by key {}, which is not a trusted key ({})", printable(r.key_id.substr(0, 16)),
                                           keys.describe()));
    } else if (auto k = VerifyKey::from_der(public_key); k && k->id() == r.key_id) {
      named = *k;
      key = &*named;
    } else {
      return problem("it names no usable signer key");
    }
    r.signer = keys.empty() ? "key " + key->short_id() : fmt::format("{} ({})", key->name(), key->short_id());
    if (!envelope->signed_by(*key)) return problem(fmt::format("the signature by {} does not verify: the record was "
                                                               "altered", r.signer));
    if (r.sequence != i) return problem(fmt::format("it says it is record {} (records were removed, swapped or "
                                                    "inserted)", r.sequence));
    const std::string want_previous = i == 0 ? std::string() : sha256_hex(lines[i - 1]);
    if (r.previous != want_previous)
      return problem("it does not follow the record before it (the previous-record hash differs: records were "
                     "removed, swapped or altered)");
    r.trace_changed = !trace_sha.empty() && r.trace_sha256 != trace_sha;
    if (r.trace_changed)
      return problem(fmt::format("the trace's SHA-256 was {} then and is {} now: the trace changed since",
                                 r.trace_sha256, trace_sha));
    report.records.push_back(r);
  }
  return report;
}

}  // namespace

CustodyReport check_custody(const std::string& trace_path, const TrustedKeys& keys) {
  CustodyReport report;
  auto sum = sha256_file(trace_path);
  bool exists = false;
  auto lines = read_lines(custody_path(trace_path), exists);
  if (!lines) {
    report.exists = exists;
    report.first_problem = lines.error().message;
    return report;
  }
  report = check_lines(*lines, keys, sum ? hex(*sum) : std::string());
  report.exists = exists;
  if (!sum && report.first_problem.empty()) report.first_problem = sum.error().message;
  return report;
}

Result<CustodyRecord> add_custody_record(const std::string& trace_path, const std::string& by,
                                         const std::string& action, const SigningKey& key) {
  const std::string path = custody_path(trace_path);
  auto sum = sha256_file(trace_path);
  if (!sum) return std::unexpected(sum.error());
  bool exists = false;
  auto lines = read_lines(path, exists);
  if (!lines) return std::unexpected(lines.error());
  CustodyReport report = check_lines(*lines, TrustedKeys{}, hex(*sum));
  if (!report.first_problem.empty())
    return fail(ErrorKind::kBadTrace, "{}: {}; deja does not add to a damaged custody log", path, report.first_problem);

  nlohmann::ordered_json j;
  j["sequence"] = lines->size();
  j["time"] = rfc3339_utc(now_unix_ns());
  j["by"] = by;
  j["action"] = action;
  j["trace"] = {{"name", std::filesystem::path(trace_path).filename().string()}, {"sha256", hex(*sum)}};
  j["previous"] = lines->empty() ? std::string() : sha256_hex(lines->back());
  j["signer"] = {{"key_id", key.id()}, {"public_key", base64_encode(key.public_key().der())}};
  // ensure_ascii: a name or action in any encoding stays one valid JSON line.
  std::string line = DsseEnvelope::sign(key, std::string(kCustodyPayloadType), j.dump(-1, ' ', true,
                                        nlohmann::json::error_handler_t::replace)).to_json();
  std::string text;
  for (const std::string& l : *lines) text += l + "\n";
  text += line + "\n";
  if (auto r = write_evidence_file(path, text, "custody log", EvidenceFileRules{.inputs = {trace_path}}); !r)
    return std::unexpected(r.error());
  CustodyRecord record;
  record.sequence = lines->size();
  record.time = j["time"].get<std::string>();
  record.by = by;
  record.action = action;
  record.trace_sha256 = hex(*sum);
  record.key_id = key.id();
  record.signer = "key " + key.public_key().short_id();
  return record;
}

}  // namespace deja
