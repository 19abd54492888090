// `deja sign`: sign an existing trace (TRACE.sig), ask for an RFC 3161 time-stamp of the signature, attach the reply.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "logging/evidence_file.h"
#include "logging/output_file.h"
#include "logging/signing.h"
#include "logging/timestamp.h"
#include "logging/trace_reader.h"
#include "logging/trace_signature.h"
#include "logging/trace_verify.h"
#include "tools/command_support.h"
#include "core/exit_status.h"
#include "core/messages.h"

namespace deja {

namespace {

struct SignArgs {
  std::string trace;
  std::string key;
  std::string tsa_request;
  std::string tsa_response;
  std::string tsa_ca;
};

Result<std::string> read_file(const std::string& path, std::string_view what) {
  std::error_code ec;
  if (std::filesystem::file_size(path, ec) > (16u << 20) || ec)
    return fail(ErrorKind::kInvalidArgument, "cannot read {} {}{}", what, path, ec ? ": " + ec.message() : ": too large");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The trace as a signature states it, after it verified (structure, chain, seals) as it is.
Result<TraceFacts> facts_of(const std::string& path, trace::Header& header, trace::Footer& footer) {
  VerifyOptions options;
  options.check_signature_file = false;  // an existing TRACE.sig is what is being replaced
  VerifyReport report = verify_trace(path, options);
  if (!report.ok) return fail(ErrorKind::kBadTrace, "{}: not signed: {}", path, report.first_problem);
  auto reader = TraceReader::open(path);
  if (!reader) return std::unexpected(reader.error());
  auto index = (*reader)->read_index();
  if (!index) return std::unexpected(index.error());
  auto sum = sha256_file(path);
  if (!sum) return std::unexpected(sum.error());
  header = (*reader)->header();
  footer = *index;
  TraceFacts facts;
  facts.name = std::filesystem::path(path).filename().string();
  facts.file_sha256 = *sum;
  facts.size = (*reader)->file_size();
  facts.header_sha256 = (*reader)->header_sha256();
  if (!unhex_sha256(report.final_chain, facts.final_chain))
    return fail(ErrorKind::kBadTrace, "{}: no final chain value", path);
  facts.chunks = report.chunks;
  facts.events = report.events;
  facts.seals = report.seals;
  return facts;
}

// Every file `deja sign` reads and writes, under the one output rule (logging/output_file.h): checked before any is
// written, so `--key TRACE.sig` or `--tsa-request TRACE` is exit 2 with every file as it was.
Result<> check_files(const SignArgs& a) {
  OutputPlan plan;
  plan.add_input("the trace", a.trace);
  plan.add_input("the key", a.key);
  plan.add_input("the time-stamp reply", a.tsa_response);
  plan.add_input("the CA certificates", a.tsa_ca);
  const std::string sig_path = signature_path(a.trace);
  if (a.tsa_response.empty()) {
    plan.add_output("the signature", sig_path, OutputKind::kProduct);
  } else {
    plan.add_input("the signature", sig_path);
    plan.add_output("the time-stamp", timestamp_path(sig_path), OutputKind::kProduct);
  }
  plan.add_output("the time-stamp request", a.tsa_request, OutputKind::kProduct);
  return plan.check();
}

int attach_response(const SignArgs& a) {
  const std::string sig_path = signature_path(a.trace);
  auto text = read_file(sig_path, "signature");
  if (!text) return report_error(text.error());
  auto envelope = DsseEnvelope::parse(*text);
  if (!envelope || envelope->signatures.empty())
    return report_error(Error{ErrorKind::kBadTrace, fmt::format("{} is not a signature deja wrote", sig_path)});
  auto response = read_file(a.tsa_response, "time-stamp response");
  if (!response) return report_error(response.error());
  auto stamp = check_timestamp(*response, envelope->signatures[0].sig, a.tsa_ca);
  if (!stamp) return report_error(Error{ErrorKind::kBadTrace, fmt::format("{}: {}", a.tsa_response, stamp.error().message)});
  const std::string tsr = timestamp_path(sig_path);
  if (auto r = write_evidence_file(tsr, *response, "time-stamp", EvidenceFileRules{.inputs = {a.trace, sig_path}}); !r)
    return report_error(r.error());
  say("time-stamp by {} at {} attached as {}{}", stamp->authority, stamp->time, tsr,
      stamp->authority_checked ? "" : " (its authority was not checked: give --tsa-ca)");
  return 0;
}

}  // namespace

Result<> write_timestamp_request(const std::string& path, const DsseEnvelope& signed_trace,
                                 const std::vector<std::string>& inputs) {
  if (auto r = write_evidence_file(path, timestamp_request(signed_trace.signatures.at(0).sig), "time-stamp request",
                                   EvidenceFileRules{.mode = 0644, .inputs = inputs});
      !r)
    return r;
  say("wrote the time-stamp request {}: send it to an RFC 3161 authority, then `deja sign TRACE --tsa-response "
      "REPLY`", path);
  return {};
}

Subcommand add_sign_command(CLI::App& app) {
  auto a = std::make_shared<SignArgs>();
  auto* sign = app.add_subcommand("sign", "sign a trace: write TRACE.sig (DSSE envelope of an in-toto statement); "
                                          "RFC 3161 time-stamps of the signature");
  sign->add_option("TRACE", a->trace, "the trace")->required();
  sign->add_option("--key", a->key, "the Ed25519 private key (PEM) to sign with (`deja keygen`)");
  sign->add_option("--tsa-request", a->tsa_request,
                   "also write an RFC 3161 time-stamp request for the signature to FILE")->type_name("FILE");
  sign->add_option("--tsa-response", a->tsa_response,
                   "attach an RFC 3161 authority's reply to the request (as TRACE.sig.tsr); no --key needed")
      ->type_name("FILE");
  sign->add_option("--tsa-ca", a->tsa_ca, "with --tsa-response: check the authority against these CA certificates")
      ->type_name("FILE");
  return {sign, [a] {
            if (auto ok = check_files(*a); !ok) return report_error(ok.error());
            if (!a->tsa_response.empty()) {
              if (!a->key.empty() || !a->tsa_request.empty())
                return report_error(Error{ErrorKind::kInvalidArgument, "--tsa-response attaches a reply to an existing "
                                          "signature: give it without --key and --tsa-request"});
              return attach_response(*a);
            }
            if (a->key.empty())
              return report_error(Error{ErrorKind::kInvalidArgument, "give --key KEY (or --tsa-response FILE)"});
            auto key = SigningKey::load(a->key);
            if (!key) return report_error(key.error());
            trace::Header header;
            trace::Footer footer;
            auto facts = facts_of(a->trace, header, footer);
            if (!facts) return report_error(facts.error());
            auto envelope = write_trace_signature(a->trace, *facts, header, footer, *key);
            if (!envelope) return report_error(envelope.error());
            say("signed {} (SHA-256 {}) with key {}: {}", a->trace, hex(facts->file_sha256), key->id(),
                signature_path(a->trace));
            if (!a->tsa_request.empty()) {
              if (auto r = write_timestamp_request(a->tsa_request, *envelope, {a->trace, a->key}); !r)
                return report_error(r.error());
            }
            return 0;
          }};
}

}  // namespace deja
