/* DL4J's FlatBuffers schema as ckptd reads and writes it: the field ids of
 * FlatGraph, FlatVariable, FlatNode, FlatProperties, FlatArray and
 * UpdaterState (checked against real DL4J files, ../shared/specs/FORMAT-FACTS.md
 * section 3.2), and the shape-descriptor constants. One copy for the SameDiff
 * reader (readers/samediff.c) and writer (writers/sdgraph.c, sdarray.c). Each
 * enum's *_NSLOTS counts its fields; a writer may write fewer slots. */
#ifndef CK_SDSCHEMA_H
#define CK_SDSCHEMA_H

enum { /* FlatGraph */
       FG_ID,
       FG_VARIABLES,
       FG_NODES,
       FG_OUTPUTS,
       FG_CONFIG,
       FG_PLACEHOLDERS,
       FG_LOSS,
       FG_TRAINING,
       FG_UPDATER,
       FG_NSLOTS
};
enum { US_PARAM, US_KEYS, US_VALUES }; /* UpdaterState */
enum { FV_ID, FV_NAME, FV_DTYPE, FV_SHAPE, FV_NDARRAY, FV_DEVICE, FV_VARTYPE, FV_NSLOTS };
enum { FA_SHAPE, FA_BUFFER, FA_DTYPE, FA_BYTEORDER, FA_NSLOTS }; /* FlatArray */
enum {                                                           /* FlatNode */
       FN_ID,
       FN_NAME,
       FN_OPTYPE,
       FN_OPNUM,
       FN_PROPS,
       FN_INPUT,
       FN_INPUTPAIRED,
       FN_OUTPUT,
       FN_EXTRAPARAMS,
       FN_EXTRAINT,
       FN_EXTRABOOLS,
       FN_DIMENSIONS,
       FN_DEVICE,
       FN_SCOPEID,
       FN_SCOPENAME,
       FN_OUTPUTNAMES,
       FN_OPNAME,
       FN_NSLOTS
};
enum { FP_NAME, FP_I, FP_L, FP_D, FP_A, FP_B, FP_S, FP_SHAPE, FP_NSLOTS }; /* FlatProperties */
/* the shape descriptor's order and flags, and FlatArray.byteOrder */
enum { SD_ORDER_C = 99, SD_ORDER_F = 102, SD_FLAG_EMPTY = 8, SD_BYTEORDER_BE = 1 };
/* DL4J's string dtypes */
enum { SD_UTF8 = 50, SD_UTF16 = 51, SD_UTF32 = 52 };

#endif
