// Chain-of-custody records beside a trace (TRACE.custody): signed, hash-chained entries of who did what and when.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "logging/signing.h"

namespace deja {

inline constexpr std::string_view kCustodyPayloadType = "application/vnd.deja.custody+json";

inline std::string custody_path(const std::string& trace) { return trace + ".custody"; }

// One line of TRACE.custody: a DSSE envelope whose payload states these (docs/audit.md, "Custody records").
struct CustodyRecord {
  uint64_t sequence = 0;
  std::string time;           // RFC 3339, UTC
  std::string by;             // who acted, as given
  std::string action;         // what was done, as given
  std::string trace_sha256;   // the trace's SHA-256 when the record was made (hex)
  std::string previous;       // SHA-256 of the previous line (hex), "" for the first record
  std::string key_id;         // the signer's key id
  std::string signer;         // the trusted key's name, or "key <short id>" (untrusted)
  std::string problem;        // "" when this record checks out
  bool trace_changed = false;  // the trace's SHA-256 now differs from the recorded one
};

struct CustodyReport {
  bool exists = false;  // TRACE.custody is there
  std::vector<CustodyRecord> records;
  std::string first_problem;  // "" when every record checks out
  bool trusted = false;       // every signature is by a key of `keys` (none given: false)
  std::string trace_sha256;   // the trace's SHA-256 now
};

// Reads and checks TRACE.custody: each record parses, is signed (by a key of `keys`, or, with no keys, by the key it
// names: reported untrusted), has the next sequence number and names the previous line's hash, and states the
// trace's present SHA-256. The first problem stops the check (later records are not listed).
CustodyReport check_custody(const std::string& trace_path, const TrustedKeys& keys);

// Appends a record (after checking the log as it is: a damaged log is never extended) by rewriting TRACE.custody
// through a .partial file. Returns the new record.
Result<CustodyRecord> add_custody_record(const std::string& trace_path, const std::string& by,
                                         const std::string& action, const SigningKey& key);

}  // namespace deja
