"""Bounds on size expressions and literals read from untrusted text (.dzir, manifest.json).

Both readers check an expression's shape against these before computing anything, so the work
and memory a 40-character dim can cost stay small: `9**(9**9)`, nested `**64` towers, 5000-digit
integers and 100000-deep nesting are refused with an error instead of hanging the process.
Every bound is a count, never a time. Real graphs stay far inside them (sympy's printed dims are
a few symbols, small constants, at most squares, and Max/Min of two simple arguments).
Plain data, no imports: the runtime reads it without sympy.
"""

MAX_INT = 2**63            # |integer| in a dim or attribute, every intermediate constant
MAX_INT_DIGITS = 19        # digits of an integer literal (checked before int() is called)
MAX_DEPTH = 64             # nesting of one literal or size expression
MAX_NODES = 256            # operations in one size expression
MAX_EXPONENT = 8           # exponent of a power whose base has a size symbol in it
MAX_DEGREE = 16            # polynomial degree of a size expression (refuses power towers)
MAX_TERMS = 64             # monomials a size expression can expand to (sympy's work)
MAX_DIM_CHARS = 1000       # characters of one manifest dim string

# sympy compares every pair of a Max/Min's arguments when it builds one, and again whenever it
# rebuilds it (a shape rule's ceiling, simplify): milliseconds of assumption queries a pair,
# seconds for 16 arguments. Real graphs have Max(0, 128 - s0), Min(s0, 8): one pair each.
MAX_EXTREMA_ARGS = 4       # distinct arguments of one Max or Min (after flattening)
MAX_EXTREMA_PAIRS = 6      # argument pairs over all Max and Min of one size expression
MAX_EXTREMA_NODES = 24     # nodes of one Max or Min, itself and its arguments

MAX_EVAL_STEPS = 100_000   # nodes one exact evaluation of a dim visits (a parsed dim: < 2000)
MAX_VALUE_BITS = 4096      # bits of any value met while evaluating a dim exactly
MAX_SIMPLIFY_NODES = 48    # nodes of two dims' difference sympy.simplify is asked to prove 0
MAX_SIMPLIFY_CALLS = 8     # such proofs in one parse (printed text needs none: its declared
                           # types are the inferred ones, equal in structure)
