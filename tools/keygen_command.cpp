// `deja keygen`: make an Ed25519 key pair for signing traces, checkpoints and custody records.
#include <unistd.h>

#include "logging/evidence_file.h"
#include "logging/signing.h"
#include "tools/command_support.h"
#include "core/messages.h"

namespace deja {

Subcommand add_keygen_command(CLI::App& app) {
  auto name = std::make_shared<std::string>();
  auto* keygen = app.add_subcommand("keygen", "make an Ed25519 signing key: NAME (private, 0600) and NAME.pub");
  keygen->add_option("-o,--output", *name, "the private key file; the public key goes to NAME.pub")->required();
  return {keygen, [name] {
            auto key = SigningKey::generate();
            if (!key) return report_error(key.error());
            // Neither file may exist: a key is never replaced (what it signed would lose its signer).
            const std::string pub = *name + ".pub";
            if (auto r = write_evidence_file(pub, key->public_key().pem(), "public key",
                                             EvidenceFileRules{.replace = false, .mode = 0644});
                !r)
              return report_error(r.error());
            if (auto r = write_evidence_file(*name, key->private_pem(), "private key",
                                             EvidenceFileRules{.replace = false, .mode = 0600});
                !r) {
              ::unlink(pub.c_str());  // just made by us: a public key without its private key is no use
              return report_error(r.error());
            }
            say("wrote {} (the private key: keep it secret) and {} (key id {})", *name, pub, key->id());
            return 0;
          }};
}

}  // namespace deja
