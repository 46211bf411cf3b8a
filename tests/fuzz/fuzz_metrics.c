/* libFuzzer: what retention's keep_best reads from the trainer's files
 * (agent/retention.h): a metrics.jsonl or CSV (retention.metrics_file), a
 * trainer_state.json, a checkpoint name. The first byte picks the step and
 * the metric's name; the rest is the file, and its first line the name. */
#include "fuzz_common.h"
#include "agent/retention.h"

#include <math.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const metrics[] = {"val_loss", "loss", "acc", "eval_accuracy"};
    char path[600], name[256];
    if (size < 1)
        return 0;
    const char *metric = metrics[data[0] & 3];
    int64_t step = (int64_t)(data[0] >> 2) * 100;
    snprintf(path, sizeof path, "%s/metrics", ck_fuzz_dir());
    FILE *f = fopen(path, "wb");
    if (!f)
        abort();
    fwrite(data + 1, 1, size - 1, f);
    fclose(f);
    size_t nl = 0;
    while (1 + nl < size && nl < sizeof name - 1 && data[1 + nl] != '\n' && data[1 + nl])
        nl++;
    memcpy(name, data + 1, nl);
    name[nl] = '\0';
    double v = 0;
    if (ck_retention_metric_in_file(path, metric, data[0] & 0x80, step, step / 100, &v) &&
        !isfinite(v))
        abort(); /* a value that ranks must be a number */
    if (ck_retention_metric_in_trainer_state(path, metric, &v) && !isfinite(v))
        abort();
    if (ck_retention_metric_in_name(name, metric, &v) && !isfinite(v))
        abort();
    unlink(path);
    return 0;
}
