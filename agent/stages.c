/* The pipeline's stage tables (agent/pipeline.h), in the order they run. The
 * deployment stages and their config (pack.*, verify.*) are agent/deploy.h. */
#include "agent/deploy.h"
#include "agent/pipeline.h"

#include <stddef.h>

const struct ck_pack_stage ck_pack_stages[] = {
    {"pack", ck_deploy_pack},
    {NULL, NULL},
};

const struct ck_verify_stage ck_verify_stages[] = {
    {"verify", ck_deploy_verify},
    {NULL, NULL},
};
