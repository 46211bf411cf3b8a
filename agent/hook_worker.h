/* The watcher's hooks: exec hooks driven from the event loop, webhook
 * deliveries in a helper process (agent/sender.h) on a database connection
 * of its own, so the watcher never waits on a receiver. Events are stored
 * in the outbox by whoever emits them (agent/notify.h); the outbox's waker
 * kicks the helper. */
#ifndef CK_HOOK_WORKER_H
#define CK_HOOK_WORKER_H

#include "agent/loop.h"
#include "agent/state.h"
#include "hooks/hooks.h"

struct ck_hook_worker;

/* Takes h over (NULL: no hooks; *out stays NULL). On an error *out is still
 * set when h was kept (the exec hooks run; stop it as usual). */
int ck_hook_worker_start(struct ck_hook_worker **out, struct ck_hooks *h, struct ck_loop *loop,
                         struct ck_state *st);
/* The hooks, for emitting events (borrowed; NULL for a NULL worker). */
struct ck_hooks *ck_hook_worker_hooks(const struct ck_hook_worker *hw);
/* Outside the loop: lets the webhook helper report for timeout_ms. */
void ck_hook_worker_pump(struct ck_hook_worker *hw, int timeout_ms);
/* Delivers what is due for up to drain seconds, lets the exec hooks finish,
 * frees the hooks and the worker. A delivery cut short stays in the outbox
 * for the next start. NULL is fine. */
void ck_hook_worker_stop(struct ck_hook_worker *hw, double drain);

#endif
