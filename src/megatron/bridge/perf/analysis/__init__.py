"""Reading what a profiled run did: a torch profiler trace's hidden and exposed dispatch/combine time
(``overlap_analysis``, its command line ``overlap_analysis_cli``), where a step's time goes
(``step_anatomy``, ``trace_summary``) and which exchanges stay exposed in megatron-core's EP-overlap
schedule (``exchange_exposure``). Nothing here launches or imports the training side."""
