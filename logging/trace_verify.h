// verify_trace: `deja verify`'s ordered checks of a trace, without a machine: structure, hash chain, seals and
// signature, input files (replay, the fifth, is the CLI's).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "logging/signing.h"
#include "logging/timestamp.h"

namespace deja {

struct VerifyOptions {
  // --key / --keyring. Empty: signatures are checked against the key the trace or statement names, and the signer
  // is reported as not trusted (anyone can sign with a key of their own).
  TrustedKeys keys;
  std::vector<std::string> inputs;  // files to check against the recorded inputs' SHA-256 (--input)
  std::string signature;            // "" = TRACE.sig when it exists
  bool check_signature_file = true;  // false: leave TRACE.sig alone (`deja sign`, which replaces it)
  std::string tsa_ca;               // CA certificates to check TRACE.sig.tsr's authority against
  // Hears after each chunk how far the structure and chain check has read: bytes of the file, and events.
  std::function<void(uint64_t bytes, uint64_t file_bytes, uint64_t events)> progress;
};

enum class CheckStatus { kPassed, kFailed, kNotRun };

struct CheckResult {
  std::string name;  // "structure", "hash chain", "signature", "inputs"
  CheckStatus status = CheckStatus::kNotRun;
  std::string detail;
};

// Who stands behind the trace, as far as this verification can tell.
enum class Authentication {
  kUnsigned,    // no seals, no signature: integrity only (anyone can recompute a hash chain)
  kUntrusted,   // signatures that verify under the key they name, which no --key or --keyring vouches for
  kTrusted,     // signed by a trusted key
};

struct VerifyReport {
  bool ok = false;             // every check that ran passed and the trace is complete
  bool opened = false;         // the file is a deja trace whose header could be read
  std::string first_problem;   // empty when ok
  uint64_t chunks = 0;         // chunks that verified
  uint64_t events = 0;         // events in those chunks
  bool complete = false;       // footer + trailer present and consistent
  std::string summary;         // one paragraph for humans

  std::vector<CheckResult> checks;  // structure, hash chain, signature, inputs: in the order they are made
  Authentication authentication = Authentication::kUnsigned;
  std::string signer;               // "alice (3f2a...)": the trusted key's name, or "key 3f2a..."
  // How far the seals authenticate the trace from its start (0 without seals).
  uint64_t seals = 0;
  uint64_t sealed_chunks = 0, sealed_events = 0, sealed_bytes = 0;
  bool signature_file = false;      // TRACE.sig exists and verified
  std::optional<TimestampInfo> timestamp;
  std::string header_sha256, final_chain, file_sha256;  // hex ("" where not known)

  // The name of the first check that failed, "" when none did.
  std::string failed_check() const;
};

// Never throws or crashes on bad input; the report names the first failure and where it is.
VerifyReport verify_trace(const std::string& path, const VerifyOptions& options = {});

// The report as `deja verify` prints it: the summary, then one line per check.
std::string describe_checks(const VerifyReport& report);

}  // namespace deja
