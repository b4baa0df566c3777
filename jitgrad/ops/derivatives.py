"""The table of primitives: one entry each, with its gradient for every input.

Elementwise entries are formulas (see spec.py for the vocabulary). Structural entries
name a Tensor-level rule `rule(node, grad, saved) -> tuple of input grads`; their
compiled kernel of the same name lives in kernels/structural.py.
"""
from jitgrad.kernels import structural as K
from jitgrad.ops import rules as R
from jitgrad.graph.spec import alias, elementwise, structural

# --- elementwise: name, node class, gradient formula per input ---------------------
ADD = elementwise("add", "AddBackward0", "grad", "grad")
SUB = elementwise("sub", "SubBackward0", "grad", "-grad")
RSUB = elementwise("rsub", "RsubBackward1", "-grad")                       # p0 - self
MUL = elementwise("mul", "MulBackward0", "grad * other", "grad * self")
# other: torch's -grad * ((self / other) / other); self / (other * other) underflows to inf for small other
DIV = elementwise("div", "DivBackward0", "grad / other", "-grad * ((self / other) / other)")
RECIPROCAL = elementwise("reciprocal", "ReciprocalBackward0", "-grad * result * result")
# The pow rules are torch's pow_backward, pow_backward_self and pow_backward_exponent: the
# where()s give 0, not 0 * inf = NaN, at a zero exponent and at a zero base with exponent >= 0;
# pow() is torch's pow(Tensor, Scalar) (sqrt / rsqrt for 0.5 / -0.5, which differ from C pow at -0, -inf)
POW = elementwise("pow", "PowBackward0",                                    # self ** p0
                  "grad * p0 * pow(self, p0 - 1.0) if p0 != 0.0 else zeros_like(grad)")
POW_TT = elementwise("pow_tt", "PowBackward1",                              # self ** other
                     "where(other == 0.0, 0.0, grad * other * self ** (other - 1.0))",
                     "where((self == 0.0) & (other >= 0.0), grad * 0.0, grad * result * log(self))")
RPOW = elementwise("rpow", "PowBackward2",                                  # p0 ** self
                   "grad * where(self >= 0.0, 0.0, result * log(p0)) if p0 == 0.0 else grad * result * log(p0)")
NEG = elementwise("neg", "NegBackward0", "-grad")
EXP = elementwise("exp", "ExpBackward0", "grad * result")
LOG = elementwise("log", "LogBackward0", "grad / self")
SQRT = elementwise("sqrt", "SqrtBackward0", "grad / (2.0 * result)")
SIN = elementwise("sin", "SinBackward0", "grad * cos(self)")
COS = elementwise("cos", "CosBackward0", "grad * -sin(self)")
ERF = elementwise("erf", "ErfBackward0", "grad * 1.1283791670955126 * exp(-(self * self))")  # 2/sqrt(pi)
TANH = elementwise("tanh", "TanhBackward0", "grad * (1.0 - result * result)")
SIGMOID = elementwise("sigmoid", "SigmoidBackward0", "grad * (1.0 - result) * result")
# p0: 0 for the exact form x * Phi(x), 1 for the tanh approximation; both as torch's GeluBackward0
# (0.7071... = 1/sqrt(2), 0.3989... = 1/sqrt(2 pi), 0.7978... = sqrt(2/pi), 0.044715 torch's kappa)
GELU = elementwise("gelu", "GeluBackward0",
                   "grad * (0.5 * (1.0 + erf(self * 0.7071067811865476)) + self * 0.3989422804014327 * "
                   "exp(-0.5 * self * self)) if p0 == 0.0 else "
                   "grad * (0.5 * (1.0 + tanh(0.7978845608028654 * (self + 0.044715 * self * self * self))) + "
                   "0.5 * self * (1.0 - tanh(0.7978845608028654 * (self + 0.044715 * self * self * self)) ** 2.0) * "
                   "0.7978845608028654 * (1.0 + 3.0 * 0.044715 * self * self))")
# threshold_backward: a NaN result passes the gradient; sign() is torch's (0 at NaN)
RELU = elementwise("relu", "ReluBackward0", "where(result <= 0.0, 0.0, grad)")
ABS = elementwise("abs", "AbsBackward0", "grad * sign(self)")
CLAMP = elementwise("clamp", "ClampBackward1", "where((self >= p0) & (self <= p1), grad, 0.0)")
CLONE = elementwise("clone", "CloneBackward0", "grad")
# torch's masked_fill form: where a NaN meets a number neither side is smaller, so both get grad
MAXIMUM = elementwise("maximum", "MaximumBackward0",
                      "where(self == other, grad / 2.0, where(self < other, 0.0, grad))",
                      "where(self == other, grad / 2.0, where(self > other, 0.0, grad))")
MINIMUM = elementwise("minimum", "MinimumBackward0",
                      "where(self == other, grad / 2.0, where(self > other, 0.0, grad))",
                      "where(self == other, grad / 2.0, where(self < other, 0.0, grad))")
WHERE = elementwise("where", "WhereBackward0", "where(aux, grad, 0.0)", "where(aux, 0.0, grad)")
SIGN = elementwise("sign", "SignBackward0", "zeros_like(grad)")            # zeros, even for a NaN grad

# --- structural: kernel in kernels/structural.py, rule in rules.py ------------------
SUM = structural("sum", "SumBackward1", rule=R.sum_rule, kernel=K.k_sum)
SUM_ALL = alias("sum_all", SUM, "SumBackward0")
MEAN = alias("mean", SUM, "MeanBackward1")         # the kernel scales by fp[0]
MEAN_ALL = alias("mean_all", SUM, "MeanBackward0")
AMAX = structural("amax", "AmaxBackward0", saves=("self", "result"), rule=R.extremum_rule, kernel=K.k_amax_dims)
AMIN = alias("amin", AMAX, "AminBackward0")
MAX_ALL = structural("max_all", "MaxBackward1", saves=("self", "result"), rule=R.evenly_rule, kernel=K.k_max_all)  # torch's own rule
MIN_ALL = alias("min_all", MAX_ALL, "MinBackward1")
MAX_DIM = structural("max_dim", "MaxBackward0", saves=("aux",), rule=R.scatter_rule, kernel=K.k_scatter)
MIN_DIM = alias("min_dim", MAX_DIM, "MinBackward0")
INDEX = alias("index", MAX_DIM, "IndexBackward0")  # same kernel: scatter grad at saved flat indices
SELECT = alias("select", MAX_DIM, "SelectBackward0")
SLICE = alias("slice", MAX_DIM, "SliceBackward0")
MAX_POOL2D = alias("max_pool2d", MAX_DIM, "MaxPool2DWithIndicesBackward0")
REFLECTION_PAD2D = alias("reflection_pad2d", MAX_DIM, "ReflectionPad2DBackward0")   # Conv2d padding modes
REPLICATION_PAD2D = alias("replication_pad2d", MAX_DIM, "ReplicationPad2DBackward0")
INDEX_PUT = structural("index_put", "IndexPutBackward0", saves=("aux",), rule=R.gather_rule, kernel=K.k_index_put)
PROD = structural("prod", "ProdBackward1", saves=("self", "result"), rule=R.prod_rule, kernel=K.k_prod_dims)
PROD_ALL = structural("prod_all", "ProdBackward0", saves=("self", "result"), rule=R.prod_all_rule, kernel=K.k_prod_all)
MATMUL = structural("matmul", "MmBackward0", saves=("self", "other"), rule=R.matmul_rule, kernel=K.k_matmul)
DOT = alias("dot", MATMUL, "DotBackward0")
MV = alias("mv", MATMUL, "MvBackward0")
BMM = alias("bmm", MATMUL, "UnsafeViewBackward0")
ADDMM = structural("addmm", "AddmmBackward0", saves=("mat1", "mat2"), rule=R.addmm_rule, kernel=K.k_addmm)
LINEAR_MM = alias("linear_mm", ADDMM, "MmBackward0")  # x @ W.t() without a bias: addmm's kernel, no input
TRACE = structural("trace", "TraceBackward0", rule=R.trace_rule, kernel=K.k_trace)
PERMUTE = structural("permute", "PermuteBackward0", rule=R.permute_rule, kernel=K.k_permute)
TRANSPOSE = alias("transpose", PERMUTE, "TransposeBackward0")
T = alias("t", PERMUTE, "TBackward0")
VIEW = structural("view", "ViewBackward0", rule=R.view_rule, kernel=K.k_view)
RESHAPE_ALIAS = alias("unsafe_view", VIEW, "UnsafeViewBackward0")
SQUEEZE = alias("squeeze", VIEW, "SqueezeBackward0")
SQUEEZE_DIM = alias("squeeze_dim", VIEW, "SqueezeBackward1")
UNSQUEEZE = alias("unsqueeze", VIEW, "UnsqueezeBackward0")
EXPAND = structural("expand", "ExpandBackward0", rule=R.expand_rule, kernel=K.k_expand)
CAT = structural("cat", "CatBackward0", rule=R.cat_rule, kernel=K.k_cat)
STACK = alias("stack", CAT, "StackBackward0")
SOFTMAX = structural("softmax", "SoftmaxBackward0", saves=("result",), rule=R.softmax_rule, kernel=K.k_softmax_grad)
LOG_SOFTMAX = structural("log_softmax", "LogSoftmaxBackward0", saves=("result",), rule=R.log_softmax_rule, kernel=K.k_log_softmax_grad)
CONVOLUTION = structural("convolution", "ConvolutionBackward0", saves=("self", "other"), rule=R.conv_rule, kernel=K.k_conv)
LAYER_NORM = structural("layer_norm", "NativeLayerNormBackward0", saves=("self", "mean", "rstd", "other"),
                        rule=R.layer_norm_rule, kernel=K.k_layer_norm)
EMBEDDING = structural("embedding", "EmbeddingBackward0", saves=("aux", "coef"), rule=R.embedding_rule, kernel=K.k_embedding)
NLL_LOSS = structural("nll_loss", "NllLossBackward0", saves=("target", "weight"), rule=R.nll_rule, kernel=K.k_nll)
TO_COPY = structural("to_copy", "ToCopyBackward0", rule=R.to_copy_rule)

# --- in-place overwrites: where(False, old, value) under torch's node names -------------
# the value lands everywhere and the old values (NaN and inf included) get an exact zero
FILL = alias("fill", WHERE, "FillBackward2")              # fill_(number)
FILL_TENSOR = alias("fill_tensor", WHERE, "FillBackward3")  # fill_(0-d tensor)
ZERO = alias("zero", WHERE, "ZeroBackward0")
COPY = alias("copy", WHERE, "CopyBackwards")
