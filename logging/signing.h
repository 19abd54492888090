// Ed25519 keys, key ids and DSSE envelopes (OpenSSL EVP): what signed traces, seals, checkpoints and custody share.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace deja {

// An Ed25519 public key. Its id is the lowercase hex SHA-256 of its DER SubjectPublicKeyInfo, what
// `openssl pkey -pubin -in KEY.pub -outform DER | sha256sum` prints (docs/audit.md).
class VerifyKey {
 public:
  // A PEM file holding a public key ("PUBLIC KEY") or a private key ("PRIVATE KEY", whose public half is taken).
  static Result<VerifyKey> load(const std::string& path);
  // DER SubjectPublicKeyInfo, as a trace header or a statement carries it.
  static Result<VerifyKey> from_der(std::string_view der);

  const std::string& id() const { return id_; }
  std::string short_id() const { return id_.substr(0, 16); }
  const std::string& der() const { return der_; }
  std::string pem() const;
  // Who the key is, for messages: the keyring file's name, the path it was loaded from, or "key <short id>".
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }
  // Ed25519 over the whole message (RFC 8032 pure mode: what `openssl pkeyutl -verify -rawin` checks).
  bool verify(std::string_view message, std::string_view signature) const;

 private:
  std::shared_ptr<void> pkey_;  // EVP_PKEY*, opaque so OpenSSL headers stay out of this header
  std::string der_;
  std::string id_;
  std::string name_;
};

// An Ed25519 private key.
class SigningKey {
 public:
  static Result<SigningKey> generate();
  // A PEM private key (PKCS#8 "PRIVATE KEY", what `deja keygen` and `openssl genpkey -algorithm ed25519` write).
  // Refused with the reason: a missing or unreadable file, an encrypted key (deja never prompts), another algorithm.
  static Result<SigningKey> load(const std::string& path);

  const VerifyKey& public_key() const { return public_; }
  const std::string& id() const { return public_.id(); }
  std::string sign(std::string_view message) const;  // 64 bytes
  std::string private_pem() const;

 private:
  std::shared_ptr<void> pkey_;
  VerifyKey public_;
};

// The keys a verification trusts: --key files and the *.pub files of a --keyring directory, named by file.
class TrustedKeys {
 public:
  Result<> add_key_file(const std::string& path);
  Result<> add_keyring(const std::string& dir);
  bool empty() const { return keys_.empty(); }
  const VerifyKey* find(std::string_view id) const;
  std::string describe() const;  // "alice (3f2a...), bob (...)"

 private:
  std::vector<VerifyKey> keys_;
};

// DSSE (github.com/secure-systems-lab/dsse, envelope v1): a payload, its type, and signatures over the
// pre-authentication encoding PAE = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body, LEN in ASCII decimal.
std::string dsse_pae(std::string_view payload_type, std::string_view payload);

struct DsseSignature {
  std::string keyid;
  std::string sig;  // raw signature bytes (base64 in the JSON)
};

struct DsseEnvelope {
  std::string payload_type;
  std::string payload;  // raw bytes (base64 in the JSON)
  std::vector<DsseSignature> signatures;

  std::string to_json() const;  // one line, no trailing newline
  static Result<DsseEnvelope> parse(std::string_view json);
  // An envelope with one signature by `key` over PAE(payload_type, payload).
  static DsseEnvelope sign(const SigningKey& key, std::string payload_type, std::string payload);
  // The signature made by key `key` and valid under it, or nullptr.
  const DsseSignature* signed_by(const VerifyKey& key) const;
};

std::string base64_encode(std::string_view bytes);
Result<std::string> base64_decode(std::string_view text);
// "2026-03-01T12:00:00.123456789Z" (RFC 3339, UTC).
std::string rfc3339_utc(int64_t unix_ns);
int64_t now_unix_ns();

}  // namespace deja
