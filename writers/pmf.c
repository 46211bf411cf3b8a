typedef int ck_pmf_unused;
