"""Pipeline stages over engine/wire: PartitionPlan (bands of layers by weight bytes), Stage and StageNode (a
band served behind a link), PipelineModel / StagedPool (the model seam the scheduler sees), PipelinedScheduler
(one scheduler per group of lanes in flight, a ServingEngine) and PipelineCollector (fak_pipeline_* metrics).
"""

from engine.pipeline.metrics import PipelineCollector, pipeline_stats
from engine.sched.api import register_pipeline_view

# a NativeScheduler over a PipelineModel reports its pipeline through this (engine/sched cannot import us)
register_pipeline_view(pipeline_stats, PipelineCollector)
