/* The control channel between `ckptd status DIR --finished|--failed` and the
 * watcher holding DIR's lock. A request is DIR/.ckptd/request.PID (the word
 * "finished" or "failed"); the watcher answers in DIR/.ckptd/reply.PID
 * ("ok STATUS" or "error MESSAGE"). Files, not a socket: a request left
 * while no watcher runs is taken by the next one. */
#ifndef CK_CONTROL_H
#define CK_CONTROL_H

#include <stdbool.h>
#include <stddef.h>

/* The server side, in the watcher. */
struct ck_control {
    const char *dir;
    /* Ends the training with status (CK_PMF_FINISHED or CK_PMF_FAILED); on
     * success writes the status reached into answer; an error's message
     * becomes the reply. */
    int (*end)(void *arg, int status, char *answer, size_t answersz);
    void *arg;
    const bool *stop; /* no more requests once it is true (may be NULL) */
};

/* Answers every request waiting in DIR/.ckptd. */
void ck_control_serve(const struct ck_control *c);

/* The client side: asks the watcher holding DIR's lock to end the training
 * with status. 0 when it did (answer gets "finished"); CK_ESTATE with the
 * watcher's message when it refused; CK_ENOENT when no watcher answered
 * within timeout seconds or the lock became free (the caller may then do it
 * under the lock itself). */
int ck_control_request(const char *dir, int status, double timeout, char *answer,
                       size_t answersz);

#endif
