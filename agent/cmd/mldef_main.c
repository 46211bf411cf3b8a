/* mldef: create, check, verify and run .mldef archives. See docs/mldef.md. */
#include "agent/cmd/cmd_mldef.h"

int main(int argc, char **argv)
{
    return ck_mldef_main(argc, argv);
}
