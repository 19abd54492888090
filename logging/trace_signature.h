// What deja signs about a trace: seal claims (in seal frames) and the in-toto statement of TRACE.sig, both in DSSE
// envelopes; and checking them. docs/audit.md is the normative description.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "logging/signing.h"
#include "logging/trace_format.h"

namespace deja {

inline constexpr std::string_view kSealPayloadType = "application/vnd.deja.seal+json";
inline constexpr std::string_view kInTotoPayloadType = "application/vnd.in-toto+json";
inline constexpr std::string_view kInTotoStatementType = "https://in-toto.io/Statement/v1";
inline constexpr std::string_view kRecordingPredicateType = "https://deja.invalid/attestation/recording/v1";
inline constexpr std::string_view kCheckpointPredicateType = "https://deja.invalid/attestation/checkpoint/v1";

// What a seal signs: the chain value after the first `chunks` chunk frames, which commits to the header and every
// event before it.
struct SealClaims {
  uint64_t sequence = 0;    // 0, 1, 2, ... in file order
  uint64_t chunks = 0;
  uint64_t events = 0;
  uint64_t end_offset = 0;  // the seal frame's own offset: where the sealed prefix ends
  Sha256 chain{};
  Sha256 header_sha256{};
  int64_t sealed_at_unix_ns = 0;
};
std::string seal_payload(const SealClaims& claims);
Result<SealClaims> parse_seal_payload(std::string_view payload);

// A trace file as a signature states it.
struct TraceFacts {
  std::string name;  // the subject's name: the file's base name
  Sha256 file_sha256{};
  uint64_t size = 0;
  Sha256 header_sha256{};
  Sha256 final_chain{};  // the footer frame's chain value, which the trailer repeats
  uint64_t chunks = 0;
  uint64_t events = 0;
  uint64_t seals = 0;
};

// The in-toto Statement v1 of TRACE.sig: subject the trace's SHA-256; predicate (kRecordingPredicateType) the
// header hash, final chain value, recorder, inputs, machine, host, times and signer.
std::string recording_statement(const TraceFacts& facts, const trace::Header& header, const trace::Footer& footer,
                                const VerifyKey& signer, int64_t signed_at_unix_ns);

// What a statement's reader needs of it (parse_statement checks the form, not the facts).
struct Statement {
  std::string predicate_type;
  std::string subject_name;
  std::string subject_sha256;  // hex
  std::string signer_key_id;
  std::string signer_public_key;  // DER, from the predicate ("" if absent)
  std::string signed_at;
  std::string predicate_json;  // the predicate, for display
  // Recording statements: the trace's header hash and final chain value (hex); checkpoint statements: the
  // trace header the checkpoint belongs to.
  std::string header_sha256;
  std::string final_chain;
};
Result<Statement> parse_statement(std::string_view payload);

// The detached signature of TRACE: TRACE.sig; its RFC 3161 time-stamp token: TRACE.sig.tsr.
inline std::string signature_path(const std::string& trace) { return trace + ".sig"; }
inline std::string timestamp_path(const std::string& signature) { return signature + ".tsr"; }

// Writes TRACE.sig for `facts` (deja's output-file rules; the trace is an input it never replaces). Returns the
// envelope.
Result<DsseEnvelope> write_trace_signature(const std::string& trace_path, const TraceFacts& facts,
                                           const trace::Header& header, const trace::Footer& footer,
                                           const SigningKey& key);

class TraceWriter;
// TRACE.sig for a trace `writer` just finished, from what the writer knows (no second read of the file).
Result<DsseEnvelope> sign_finished_trace(const TraceWriter& writer, const trace::Header& header,
                                         const trace::Footer& footer, const SigningKey& key);

// Who signed a trace: the sealing key its header names, else the key TRACE.sig's statement names and verifies under
// (none: the trace is unsigned). A signed trace's checkpoint files must be signed by this key.
std::optional<VerifyKey> trace_signer(const std::string& trace_path, const trace::Header& header);

// A checkpoint file's signature (FILE.sig): subject the file's SHA-256; predicate the trace header it belongs to.
Result<> write_checkpoint_signature(const std::string& checkpoint_path, const Sha256& trace_header_sha256,
                                    const SigningKey& key);
// Whether FILE.sig exists, is signed by `key` and states this file and trace header; else why not.
Result<> check_checkpoint_signature(const std::string& checkpoint_path, const Sha256& trace_header_sha256,
                                    const VerifyKey& key);

}  // namespace deja
