/* The `mldef` command line; main() of the mldef executable, and of ckptd
 * when it is started under the name mldef. */
#ifndef CK_CMD_MLDEF_H
#define CK_CMD_MLDEF_H

int ck_mldef_main(int argc, char **argv);

#endif
