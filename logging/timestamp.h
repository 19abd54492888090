// RFC 3161 time-stamps of a signature (OpenSSL's TS API): the request deja writes and the token it checks.
#pragma once

#include <string>
#include <string_view>

#include "core/error.h"

namespace deja {

// A DER TimeStampReq for SHA-256(`signature`), asking for the TSA's certificate in the reply (what `openssl ts
// -query -data SIG -sha256 -cert` makes), to send to any RFC 3161 authority.
std::string timestamp_request(std::string_view signature);

struct TimestampInfo {
  std::string time;       // the token's genTime, "2026-03-01T12:00:00Z"
  std::string authority;  // the signing certificate's subject, or the token's TSA name
  bool authority_checked = false;  // the token's signature and certificate chain verified against a CA file
};

// Checks a DER TimeStampResp: granted, and a token over SHA-256(`signature`); with `ca_file`, also its signature and
// the TSA certificate's chain (extended key usage timeStamping) up to that CA. A failure says which.
Result<TimestampInfo> check_timestamp(std::string_view response, std::string_view signature, const std::string& ca_file);

}  // namespace deja
