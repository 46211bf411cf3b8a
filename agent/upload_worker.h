/* Uploads for the watcher. A thread with its own connection to the state
 * database runs the upload queue whenever a pass changed the tree, so the
 * event loop never waits on the network. How each job ended comes back to
 * the loop's thread through an eventfd, where it becomes an upload.* event
 * (the hooks are not shared between threads). */
#ifndef CK_UPLOAD_WORKER_H
#define CK_UPLOAD_WORKER_H

#include "agent/config.h"
#include "stores/uploader.h"

#include <stdbool.h>

struct ck_upload_worker;

/* Starts the thread for cfg's upload.stores (cfg must outlive the worker).
 * dir is the PMF root, state_dir its .ckptd folder. */
int ck_upload_worker_start(struct ck_upload_worker **out, const struct ck_config *cfg,
                           const char *dir, const char *state_dir);
/* Readable when outcomes wait for ck_upload_worker_drain. */
int ck_upload_worker_fd(const struct ck_upload_worker *w);
/* The tree changed: queue what is new (metadata.yaml last) and send it. */
void ck_upload_worker_kick(struct ck_upload_worker *w);
/* Calls fn on this thread for each job that ended since the last drain. */
void ck_upload_worker_drain(struct ck_upload_worker *w,
                            void (*fn)(void *arg, const struct ck_upload_outcome *o), void *arg);
/* Asks the thread to stop: in-flight transfers get grace seconds, what is
 * not sent stays queued for the next start. */
void ck_upload_worker_stop(struct ck_upload_worker *w, double grace);
/* Whether the thread has nothing left to do now (queue empty or only
 * failures waiting for a later retry), or has stopped. */
bool ck_upload_worker_is_idle(struct ck_upload_worker *w);
/* Waits for a stopped thread to end; its last outcomes stay for a drain. */
void ck_upload_worker_join(struct ck_upload_worker *w);
/* Stops (if not yet), joins and frees. NULL is fine. */
void ck_upload_worker_free(struct ck_upload_worker *w);

#endif
