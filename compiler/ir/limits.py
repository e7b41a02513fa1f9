"""Bounds on size expressions and literals read from untrusted text (.dzir, manifest.json).

Both readers check an expression's shape against these before computing anything, so the work
and memory a 40-character dim can cost stay small: `9**(9**9)`, nested `**64` towers, 5000-digit
integers and 100000-deep nesting are refused with an error instead of hanging the process.
Real graphs stay far inside them (sympy's printed dims are a few symbols, small constants and
at most squares). Plain data, no imports: the runtime reads it without sympy.
"""

MAX_INT = 2**63            # |integer| in a dim or attribute, every intermediate constant
MAX_INT_DIGITS = 19        # digits of an integer literal (checked before int() is called)
MAX_DEPTH = 64             # nesting of one literal or size expression
MAX_NODES = 256            # operations in one size expression
MAX_EXPONENT = 8           # exponent of a power whose base has a size symbol in it
MAX_DEGREE = 16            # polynomial degree of a size expression (refuses power towers)
MAX_TERMS = 64             # monomials a size expression can expand to (sympy's work)
MAX_DIM_CHARS = 1000       # characters of one manifest dim string
