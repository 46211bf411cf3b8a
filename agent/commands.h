/* One entry point per command; the table is in commands.c. */
#ifndef CK_COMMANDS_H
#define CK_COMMANDS_H

int ck_cmd_scan(int argc, char **argv);
int ck_cmd_config(int argc, char **argv);
int ck_cmd_inspect(int argc, char **argv);
int ck_cmd_hooks(int argc, char **argv);

#endif
