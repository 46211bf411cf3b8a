#include "agent/upload_round.h"
#include "agent/retention.h"
#include "common/error.h"
#include "common/log.h"

#include <signal.h>
#include <stdatomic.h>
#include <string.h>

int ck_upload_round_run(sqlite3 *db, const struct ck_upload_round *r, struct ck_upload_ctl *ctl,
                        struct ck_upload_report *rep)
{
    const struct ck_config *cfg = r->cfg;
    int queued = 0, err;
    memset(rep, 0, sizeof *rep);
    if ((err = ck_queue_init(db)) < 0)
        return err;
    if (r->root) {
        /* the stores' metadata.yaml keeps what retention deleted locally */
        if ((err = ck_retention_remote_meta(db, r->root)) < 0)
            return err;
        if ((err = ck_uploader_enqueue_pmf(db, cfg->upload_stores, cfg->n_upload_stores, r->root,
                                           false, &queued)) < 0)
            return err;
        if (queued)
            ck_info("upload.queued_tree", "dir=\"%s\" jobs=%d", r->root, queued);
    }
    if ((err = ck_uploader_run(db, &cfg->upload, r->spool, ctl, &r->run, rep)) < 0)
        return err;
    if (!r->quiet_when_idle || rep->done || rep->failed || rep->left)
        ck_info("upload.summary", "done=%d failed=%d left=%d blocked=%d%s", rep->done, rep->failed,
                rep->left, rep->blocked, rep->stopped ? " stopped=yes" : "");
    return 0;
}

/* The handlers set only the stop flag. */
static struct ck_upload_ctl *volatile g_ctl;

static void on_signal(int sig)
{
    (void)sig;
    if (g_ctl)
        atomic_store(&g_ctl->stop, 1);
}

int ck_upload_round_foreground(sqlite3 *db, const struct ck_upload_round *r,
                               struct ck_upload_report *rep)
{
    struct ck_upload_ctl ctl;
    struct sigaction sa, ign, old[3];
    ck_upload_ctl_init(&ctl, r->cfg->upload.grace);
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    g_ctl = &ctl;
    sigaction(SIGTERM, &sa, &old[0]);
    sigaction(SIGINT, &sa, &old[1]);
    sigaction(SIGPIPE, &ign, &old[2]);
    int err = ck_upload_round_run(db, r, &ctl, rep);
    sigaction(SIGTERM, &old[0], NULL);
    sigaction(SIGINT, &old[1], NULL);
    sigaction(SIGPIPE, &old[2], NULL);
    g_ctl = NULL;
    return err;
}
