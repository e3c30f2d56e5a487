# Cython declarations for wr.py (compiled mode only; see softverbs.compiled).
# The constructor checks each C member with base's rule, c_member: cimported,
# so the check is a C call (the module is therefore in compiled.LINKED).

from softverbs.verbs.base cimport c_member
