#include "agent/cmd/cli.h"
#include "agent/cmd/commands.h"

#include <stddef.h>

/* Adding a command: write ck_cmd_NAME in its own file, declare it in
 * commands.h, add a row here (alphabetical), add it to the README's command
 * table; ckptd(1) and docs/commands.md are generated from its --help. */
const struct ck_command ck_commands[] = {
    {"bundle", ck_cmd_bundle, "pack a PMF tree into one zstd-compressed tar"},
    {"config", ck_cmd_config, "check a config file, or list every config key"},
    {"fetch", ck_cmd_fetch, "bring back a checkpoint retention deleted, from a store (MD5-checked)"},
    {"hooks", ck_cmd_hooks, "test a webhook; emit, deliver or replay events; hook status"},
    {"inspect", ck_cmd_inspect, "list a checkpoint's tensors, metadata, graph; check checksums"},
    {"keygen", ck_cmd_keygen, "write an Ed25519 key pair for signing archives"},
    {"pack", ck_cmd_pack, "pack a checkpoint into a deployment archive (.mldef; samediff: a tag per checkpoint)"},
    {"queue", ck_cmd_queue, "list the upload queue; retry failed jobs; run it now"},
    {"scan", ck_cmd_scan, "bring DIR's PMF tree up to date once, then exit (for cron)"},
    {"status", ck_cmd_status, "show DIR's training status; end the training (--finished, --failed)"},
    {"upload", ck_cmd_upload, "upload a file or a PMF tree to a store (s3, http, sftp, file)"},
    {"verify", ck_cmd_verify, "run a checkpoint's network on the CPU and check its outputs"},
    {"watch", ck_cmd_watch, "keep DIR's PMF tree current while training runs (the sidecar)"},
    {NULL, NULL, NULL},
};
