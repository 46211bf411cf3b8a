/* ckptd keygen -o KEY: an Ed25519 key pair for signing archives. */
#include "agent/cmd/cli.h"
#include "agent/cmd/commands.h"
#include "common/error.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/sign.h"

#include <stdio.h>

static const char help[] =
    "usage: ckptd keygen -o KEY\n"
    "\n"
    "Writes a new Ed25519 key pair: the private key to KEY (mode 0600) and the\n"
    "public key to KEY.pub. Refuses to overwrite either. Sign with\n"
    "`ckptd pack --sign-key file:KEY` or `mldef -c -s --key KEY`; verify with\n"
    "`mldef -s --pubkey KEY.pub X.mldef`.\n"
    "\n"
    "  -o, --output KEY      the private key file to create\n" CK_CLI_HELP;

int ck_cmd_keygen(int argc, char **argv)
{
    static const struct option longopts[] = {
        CK_CLI_LONGOPTS, {"output", required_argument, NULL, 'o'}, {NULL, 0, NULL, 0}};
    struct ck_cli cli;
    const char *out = NULL;
    int opt, rc;
    ck_cli_init(&cli);
    optind = 1;
    while ((opt = getopt_long(argc, argv, "c:vqho:", longopts, NULL)) != -1) {
        if ((rc = ck_cli_common(&cli, "keygen", opt, optarg)) != 0) {
            if (rc != 1)
                return rc;
            continue;
        }
        if (opt == 'o')
            out = optarg;
        else
            return ck_cli_usage_error("keygen", "unknown option");
    }
    if (cli.help) {
        fputs(help, stdout);
        return CK_EXIT_OK;
    }
    ck_cli_setup_logging(&cli, -1, -1);
    if (argc != optind || !out)
        return ck_cli_usage_error("keygen", "expected -o KEY");
    struct ck_sign_key k;
    int err = ck_sign_generate(&k);
    if (err == 0)
        err = ck_sign_write_keys(&k, out);
    char pub[65];
    ck_hex(pub, k.pub, sizeof k.pub);
    ck_sign_key_wipe(&k);
    if (err < 0)
        return ck_cli_fail("keygen", err);
    ck_info("keygen.written", "path=\"%s\" public=\"%s.pub\" key=%s", out, out, pub);
    return CK_EXIT_OK;
}
