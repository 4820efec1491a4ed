"""Session 55: causal LM types that hf._kind built as bare encoders (no CausalLM-only rule), run as causal LMs
through session 54's survey: python scratch/s55/decoder_kind_sweep.py <model type>"""
import runpy, sys
from fa4_inductor import hf
_old = hf._kind
def _kind(config):
    k = _old(config)
    if k == "encoder" and hf._causal_lm(config):
        import transformers
        if type(config) not in transformers.AutoModelForMaskedLM._model_mapping:
            return "causal-lm"
    return k
hf._kind = _kind
sys.argv = ["x"] + sys.argv[1:]
runpy.run_path("scratch/s54/model_type_sweep.py", run_name="__main__")
