// RFC 3161 requests and responses through OpenSSL's TS_REQ / TS_RESP / TS_VERIFY_CTX.
#include "logging/timestamp.h"

#include <cstring>
#include <memory>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pkcs7.h>
#include <openssl/rand.h>
#include <openssl/ts.h>
#include <openssl/x509.h>

#include "logging/trace_format.h"

namespace deja {

namespace {

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using Request = std::unique_ptr<TS_REQ, Deleter<TS_REQ, TS_REQ_free>>;
using Response = std::unique_ptr<TS_RESP, Deleter<TS_RESP, TS_RESP_free>>;
using VerifyContext = std::unique_ptr<TS_VERIFY_CTX, Deleter<TS_VERIFY_CTX, TS_VERIFY_CTX_free>>;

std::string openssl_errors() {
  std::string text;
  while (unsigned long code = ERR_get_error()) {
    char buffer[256];
    ERR_error_string_n(code, buffer, sizeof buffer);
    text += (text.empty() ? "" : "; ") + std::string(buffer);
  }
  return text.empty() ? "no detail" : text;
}

Sha256 digest_of(std::string_view signature) {
  return sha256_bytes(std::span(reinterpret_cast<const uint8_t*>(signature.data()), signature.size()));
}

std::string generalized_time(const ASN1_GENERALIZEDTIME* t) {
  std::tm tm{};
  if (t == nullptr || ASN1_TIME_to_tm(t, &tm) != 1) return "unknown";
  char buffer[64];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buffer;
}

}  // namespace

std::string timestamp_request(std::string_view signature) {
  Sha256 digest = digest_of(signature);
  Request req(TS_REQ_new());
  std::unique_ptr<TS_MSG_IMPRINT, Deleter<TS_MSG_IMPRINT, TS_MSG_IMPRINT_free>> imprint(TS_MSG_IMPRINT_new());
  std::unique_ptr<X509_ALGOR, Deleter<X509_ALGOR, X509_ALGOR_free>> algorithm(X509_ALGOR_new());
  std::unique_ptr<ASN1_INTEGER, Deleter<ASN1_INTEGER, ASN1_INTEGER_free>> nonce(ASN1_INTEGER_new());
  uint64_t nonce_value = 0;
  DEJA_ASSERT(req && imprint && algorithm && nonce, "allocating a time-stamp request failed");
  DEJA_ASSERT(RAND_bytes(reinterpret_cast<unsigned char*>(&nonce_value), sizeof nonce_value) == 1, "RAND_bytes failed");
  DEJA_ASSERT(X509_ALGOR_set0(algorithm.get(), OBJ_nid2obj(NID_sha256), V_ASN1_NULL, nullptr) == 1 &&
                  TS_MSG_IMPRINT_set_algo(imprint.get(), algorithm.get()) == 1 &&
                  TS_MSG_IMPRINT_set_msg(imprint.get(), digest.data(), int(digest.size())) == 1 &&
                  TS_REQ_set_version(req.get(), 1) == 1 && TS_REQ_set_msg_imprint(req.get(), imprint.get()) == 1 &&
                  ASN1_INTEGER_set_uint64(nonce.get(), nonce_value >> 1) == 1 &&
                  TS_REQ_set_nonce(req.get(), nonce.get()) == 1 && TS_REQ_set_cert_req(req.get(), 1) == 1,
              "building a time-stamp request failed: {}", openssl_errors());
  unsigned char* der = nullptr;
  int n = i2d_TS_REQ(req.get(), &der);
  DEJA_ASSERT(n > 0, "encoding a time-stamp request failed: {}", openssl_errors());
  std::string out(reinterpret_cast<const char*>(der), size_t(n));
  OPENSSL_free(der);
  return out;
}

Result<TimestampInfo> check_timestamp(std::string_view response, std::string_view signature,
                                      const std::string& ca_file) {
  const auto* p = reinterpret_cast<const unsigned char*>(response.data());
  Response resp(d2i_TS_RESP(nullptr, &p, long(response.size())));
  if (!resp) {
    ERR_clear_error();
    return fail(ErrorKind::kBadTrace, "not an RFC 3161 time-stamp response (DER TimeStampResp)");
  }
  long status = ASN1_INTEGER_get(TS_STATUS_INFO_get0_status(TS_RESP_get_status_info(resp.get())));
  TS_TST_INFO* info = TS_RESP_get_tst_info(resp.get());
  if ((status != 0 && status != 1) || info == nullptr)
    return fail(ErrorKind::kBadTrace, "the time-stamp authority did not grant the request (PKIStatus {})", status);
  Sha256 digest = digest_of(signature);
  const TS_MSG_IMPRINT* imprint = TS_TST_INFO_get_msg_imprint(info);
  const ASN1_OCTET_STRING* stamped = TS_MSG_IMPRINT_get_msg(const_cast<TS_MSG_IMPRINT*>(imprint));
  if (stamped == nullptr || ASN1_STRING_length(stamped) != 32 ||
      std::memcmp(ASN1_STRING_get0_data(stamped), digest.data(), 32) != 0)
    return fail(ErrorKind::kBadTrace, "the time-stamp is of other data than this signature (message imprint differs)");

  TimestampInfo out;
  out.time = generalized_time(TS_TST_INFO_get_time(info));
  PKCS7* token = TS_RESP_get_token(resp.get());
  if (STACK_OF(X509)* signers = token ? PKCS7_get0_signers(token, nullptr, 0) : nullptr) {
    if (sk_X509_num(signers) > 0) {
      char name[256];
      X509_NAME_oneline(X509_get_subject_name(sk_X509_value(signers, 0)), name, sizeof name);
      out.authority = name;
    }
    sk_X509_free(signers);
  }
  ERR_clear_error();
  if (out.authority.empty()) out.authority = "an unnamed authority";
  if (ca_file.empty()) return out;

  X509_STORE* store = X509_STORE_new();
  if (store == nullptr || X509_STORE_load_file(store, ca_file.c_str()) != 1) {
    X509_STORE_free(store);
    return fail(ErrorKind::kInvalidArgument, "cannot load the time-stamp CA certificates from {}: {}", ca_file,
                openssl_errors());
  }
  VerifyContext ctx(TS_VERIFY_CTX_new());
  auto* copy = static_cast<unsigned char*>(OPENSSL_malloc(digest.size()));
  DEJA_ASSERT(ctx && copy, "allocating a time-stamp verification failed");
  std::memcpy(copy, digest.data(), digest.size());
  TS_VERIFY_CTX_set_flags(ctx.get(), TS_VFY_VERSION | TS_VFY_SIGNATURE | TS_VFY_IMPRINT);
  TS_VERIFY_CTX_set_imprint(ctx.get(), copy, long(digest.size()));  // owned by ctx from here
  TS_VERIFY_CTX_set_store(ctx.get(), store);                         // likewise
  if (TS_RESP_verify_response(ctx.get(), resp.get()) != 1)
    return fail(ErrorKind::kBadTrace, "the time-stamp does not verify against {}: {}", ca_file, openssl_errors());
  out.authority_checked = true;
  return out;
}

}  // namespace deja
