/* Payload templates for chat incoming-webhooks (Slack, Mattermost, Teams,
 * Discord...): a JSON text with {{field}} placeholders, each replaced by the
 * event's field JSON-escaped (without quotes, so it goes inside a string the
 * template writes: "text": "{{model_name}}: checkpoint {{checkpoint}}").
 * An unset field becomes "". Nothing else is special: no loops, no logic. */
#ifndef CK_TEMPLATE_H
#define CK_TEMPLATE_H

#include "common/buf.h"
#include "hooks/event.h"

/* Templates are small: a larger file is refused. */
#define CK_TEMPLATE_MAX (64 * 1024)

/* Checks that every {{...}} names a known field and every "{{" is closed.
 * name is for messages (the file name). */
int ck_template_check(const char *name, const char *tpl);
/* Appends the rendered template to out. */
int ck_template_render(const char *tpl, const struct ck_event *ev, struct ck_buf *out);

#endif
