// Ed25519 keys (OpenSSL EVP_PKEY, PEM), key ids, keyrings, DSSE envelopes and their JSON (nlohmann::json).
#include "logging/signing.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "logging/trace_format.h"

namespace deja {

namespace {

EVP_PKEY* raw(const std::shared_ptr<void>& p) { return static_cast<EVP_PKEY*>(p.get()); }
std::shared_ptr<void> own(EVP_PKEY* p) { return std::shared_ptr<void>(p, [](void* k) { EVP_PKEY_free(static_cast<EVP_PKEY*>(k)); }); }

// The newest OpenSSL error as text ("" when the queue is empty); clears the queue.
std::string openssl_error() {
  unsigned long code = ERR_get_error();
  std::string text;
  if (code != 0) {
    char buffer[256];
    ERR_error_string_n(code, buffer, sizeof buffer);
    text = buffer;
  }
  ERR_clear_error();
  return text;
}

Result<std::string> read_small_file(const std::string& path, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return fail(ErrorKind::kInvalidArgument, "cannot read {} {}: {}", what, path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return fail(ErrorKind::kInvalidArgument, "{} {} is not a regular file", what, path);
  if (st.st_size > (1 << 20)) return fail(ErrorKind::kInvalidArgument, "{} {} is {} bytes: not a key", what, path, st.st_size);
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(ErrorKind::kInvalidArgument, "cannot read {} {}: {}", what, path, std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A PEM password callback that refuses: deja never prompts for a passphrase.
int no_passphrase(char*, int, int, void*) { return -1; }

std::string spki_der(EVP_PKEY* pkey) {
  unsigned char* der = nullptr;
  int n = i2d_PUBKEY(pkey, &der);
  DEJA_ASSERT(n > 0, "i2d_PUBKEY failed: {}", openssl_error());
  std::string out(reinterpret_cast<const char*>(der), size_t(n));
  OPENSSL_free(der);
  return out;
}

std::string pem_of(EVP_PKEY* pkey, bool private_key) {
  std::unique_ptr<BIO, int (*)(BIO*)> bio(BIO_new(BIO_s_mem()), &BIO_free);
  DEJA_ASSERT(bio != nullptr, "BIO_new failed");
  int ok = private_key ? PEM_write_bio_PKCS8PrivateKey(bio.get(), pkey, nullptr, nullptr, 0, nullptr, nullptr)
                       : PEM_write_bio_PUBKEY(bio.get(), pkey);
  DEJA_ASSERT(ok == 1, "PEM_write failed: {}", openssl_error());
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, size_t(n));
}

}  // namespace

Result<VerifyKey> VerifyKey::from_der(std::string_view der) {
  const auto* p = reinterpret_cast<const unsigned char*>(der.data());
  EVP_PKEY* pkey = d2i_PUBKEY(nullptr, &p, long(der.size()));
  if (pkey == nullptr || p != reinterpret_cast<const unsigned char*>(der.data()) + der.size()) {
    if (pkey) EVP_PKEY_free(pkey);
    openssl_error();
    return fail(ErrorKind::kBadTrace, "not a DER SubjectPublicKeyInfo ({} bytes)", der.size());
  }
  if (EVP_PKEY_get_id(pkey) != EVP_PKEY_ED25519) {
    EVP_PKEY_free(pkey);
    return fail(ErrorKind::kBadTrace, "the public key is not an Ed25519 key");
  }
  VerifyKey key;
  key.pkey_ = own(pkey);
  key.der_ = std::string(der);
  auto digest = sha256_bytes(std::span(reinterpret_cast<const uint8_t*>(der.data()), der.size()));
  key.id_ = hex(digest);
  key.name_ = "key " + key.short_id();
  return key;
}

Result<VerifyKey> VerifyKey::load(const std::string& path) {
  auto text = read_small_file(path, "key file");
  if (!text) return std::unexpected(text.error());
  std::unique_ptr<BIO, int (*)(BIO*)> bio(BIO_new_mem_buf(text->data(), int(text->size())), &BIO_free);
  EVP_PKEY* pkey = PEM_read_bio_PUBKEY(bio.get(), nullptr, no_passphrase, nullptr);
  if (pkey == nullptr) {
    openssl_error();
    auto signing = SigningKey::load(path);
    if (!signing) {
      return fail(ErrorKind::kInvalidArgument, "{} is not a PEM Ed25519 public key (nor a private key: {})", path,
                  signing.error().message);
    }
    VerifyKey key = signing->public_key();
    key.set_name(path);
    return key;
  }
  std::string der = spki_der(pkey);
  EVP_PKEY_free(pkey);
  auto key = from_der(der);
  if (!key) return fail(ErrorKind::kInvalidArgument, "{}: {}", path, key.error().message);
  key->set_name(path);
  return key;
}

std::string VerifyKey::pem() const { return pem_of(raw(pkey_), false); }

bool VerifyKey::verify(std::string_view message, std::string_view signature) const {
  if (!pkey_ || signature.size() != 64) return false;
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  DEJA_ASSERT(ctx != nullptr, "EVP_MD_CTX_new failed");
  bool ok = EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, raw(pkey_)) == 1 &&
            EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
                             reinterpret_cast<const unsigned char*>(message.data()), message.size()) == 1;
  openssl_error();
  return ok;
}

Result<SigningKey> SigningKey::generate() {
  EVP_PKEY* pkey = EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519");
  if (pkey == nullptr) return fail(ErrorKind::kHost, "cannot generate an Ed25519 key: {}", openssl_error());
  SigningKey key;
  key.pkey_ = own(pkey);
  auto pub = VerifyKey::from_der(spki_der(pkey));
  DEJA_ASSERT(pub.has_value(), "a generated key's public half does not parse");
  key.public_ = *pub;
  return key;
}

Result<SigningKey> SigningKey::load(const std::string& path) {
  auto text = read_small_file(path, "signing key");
  if (!text) return std::unexpected(text.error());
  if (text->find("ENCRYPTED") != std::string::npos)
    return fail(ErrorKind::kInvalidArgument, "signing key {} is encrypted; deja reads unencrypted PEM keys only "
                "(it never prompts for a passphrase)", path);
  std::unique_ptr<BIO, int (*)(BIO*)> bio(BIO_new_mem_buf(text->data(), int(text->size())), &BIO_free);
  EVP_PKEY* pkey = PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr);
  if (pkey == nullptr) {
    std::string why = openssl_error();
    return fail(ErrorKind::kInvalidArgument, "{} is not a PEM private key{}{} (make one with `deja keygen -o NAME`)",
                path, why.empty() ? "" : ": ", why);
  }
  if (EVP_PKEY_get_id(pkey) != EVP_PKEY_ED25519) {
    EVP_PKEY_free(pkey);
    return fail(ErrorKind::kInvalidArgument, "signing key {} is not an Ed25519 key (deja signs with Ed25519 only)", path);
  }
  SigningKey key;
  key.pkey_ = own(pkey);
  auto pub = VerifyKey::from_der(spki_der(pkey));
  if (!pub) return fail(ErrorKind::kInvalidArgument, "signing key {}: {}", path, pub.error().message);
  key.public_ = *pub;
  key.public_.set_name(path);
  return key;
}

std::string SigningKey::sign(std::string_view message) const {
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  DEJA_ASSERT(ctx != nullptr, "EVP_MD_CTX_new failed");
  std::string signature(64, '\0');
  size_t length = signature.size();
  DEJA_ASSERT(EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, raw(pkey_)) == 1 &&
                  EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(signature.data()), &length,
                                 reinterpret_cast<const unsigned char*>(message.data()), message.size()) == 1 &&
                  length == 64,
              "Ed25519 signing failed: {}", openssl_error());
  return signature;
}

std::string SigningKey::private_pem() const { return pem_of(raw(pkey_), true); }

Result<> TrustedKeys::add_key_file(const std::string& path) {
  auto key = VerifyKey::load(path);
  if (!key) return std::unexpected(key.error());
  keys_.push_back(std::move(*key));
  return {};
}

Result<> TrustedKeys::add_keyring(const std::string& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), &::closedir);
  if (!d) return fail(ErrorKind::kInvalidArgument, "cannot read keyring {}: {}", dir, std::strerror(errno));
  std::vector<std::string> names;
  while (dirent* entry = ::readdir(d.get())) {
    std::string name = entry->d_name;
    if (name.size() > 4 && name.ends_with(".pub")) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  if (names.empty()) return fail(ErrorKind::kInvalidArgument, "keyring {} holds no *.pub public key files", dir);
  for (const std::string& name : names) {
    auto key = VerifyKey::load(dir + "/" + name);
    if (!key) return std::unexpected(key.error());
    key->set_name(name.substr(0, name.size() - 4));
    keys_.push_back(std::move(*key));
  }
  return {};
}

const VerifyKey* TrustedKeys::find(std::string_view id) const {
  for (const VerifyKey& k : keys_)
    if (k.id() == id) return &k;
  return nullptr;
}

std::string TrustedKeys::describe() const {
  std::string out;
  for (const VerifyKey& k : keys_) out += fmt::format("{}{} ({})", out.empty() ? "" : ", ", k.name(), k.short_id());
  return out;
}

std::string dsse_pae(std::string_view payload_type, std::string_view payload) {
  std::string out = fmt::format("DSSEv1 {} {} {} ", payload_type.size(), payload_type, payload.size());
  out += payload;
  return out;
}

std::string DsseEnvelope::to_json() const {
  nlohmann::ordered_json j;
  j["payloadType"] = payload_type;
  j["payload"] = base64_encode(payload);
  j["signatures"] = nlohmann::ordered_json::array();
  for (const DsseSignature& s : signatures) j["signatures"].push_back({{"keyid", s.keyid}, {"sig", base64_encode(s.sig)}});
  return j.dump();
}

Result<DsseEnvelope> DsseEnvelope::parse(std::string_view text) {
  auto bad = [](std::string what) { return std::unexpected(Error{ErrorKind::kBadTrace, "not a DSSE envelope: " + what}); };
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (!j.contains("payloadType") || !j["payloadType"].is_string()) return bad("no payloadType string");
  if (!j.contains("payload") || !j["payload"].is_string()) return bad("no payload string");
  if (!j.contains("signatures") || !j["signatures"].is_array()) return bad("no signatures array");
  DsseEnvelope e;
  e.payload_type = j["payloadType"].get<std::string>();
  auto payload = base64_decode(j["payload"].get<std::string>());
  if (!payload) return bad("the payload is not base64");
  e.payload = std::move(*payload);
  for (const auto& s : j["signatures"]) {
    if (!s.is_object() || !s.contains("sig") || !s["sig"].is_string()) return bad("a signature has no sig string");
    DsseSignature sig;
    if (s.contains("keyid") && s["keyid"].is_string()) sig.keyid = s["keyid"].get<std::string>();
    auto bytes = base64_decode(s["sig"].get<std::string>());
    if (!bytes) return bad("a signature is not base64");
    sig.sig = std::move(*bytes);
    e.signatures.push_back(std::move(sig));
  }
  return e;
}

DsseEnvelope DsseEnvelope::sign(const SigningKey& key, std::string payload_type, std::string payload) {
  DsseEnvelope e;
  e.payload_type = std::move(payload_type);
  e.payload = std::move(payload);
  e.signatures.push_back({key.id(), key.sign(dsse_pae(e.payload_type, e.payload))});
  return e;
}

const DsseSignature* DsseEnvelope::signed_by(const VerifyKey& key) const {
  const std::string pae = dsse_pae(payload_type, payload);
  for (const DsseSignature& s : signatures) {
    if (!s.keyid.empty() && s.keyid != key.id()) continue;
    if (key.verify(pae, s.sig)) return &s;
  }
  return nullptr;
}

std::string base64_encode(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()), int(bytes.size()));
  out.resize(size_t(n));
  return out;
}

Result<std::string> base64_decode(std::string_view text) {
  if (text.size() % 4 != 0) return fail(ErrorKind::kBadTrace, "base64 text of {} characters", text.size());
  std::string out(text.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(text.data()), int(text.size()));
  if (n < 0) return fail(ErrorKind::kBadTrace, "invalid base64");
  // EVP_DecodeBlock counts the padding as zero bytes.
  size_t padding = text.ends_with("==") ? 2 : text.ends_with("=") ? 1 : 0;
  out.resize(size_t(n) - padding);
  return out;
}

std::string rfc3339_utc(int64_t unix_ns) {
  std::time_t seconds = static_cast<std::time_t>(unix_ns / 1000000000);
  std::tm tm{};
  if (unix_ns < 0 || gmtime_r(&seconds, &tm) == nullptr) return "1970-01-01T00:00:00Z";
  char buffer[64];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:09}Z", buffer, unix_ns % 1000000000);
}

int64_t now_unix_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace deja
