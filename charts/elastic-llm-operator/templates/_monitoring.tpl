{{/*
The scrapes the alerts read. Every alert of prometheusRule.alerts reads the operator's series (llmjob_*, its
`up`), scraped by the chart's ServiceMonitor or, with prometheusRule.operatorSelector set, by a scrape of
the user's own; the alerts named in llmop.trainerAlerts read the workers' (llm_trainer_*), scraped by the
trainer PodMonitor. tests/chart/test_chart_doc_tables.py checks this split against each alert's expression.
*/}}
{{- define "llmop.trainerAlerts" -}}
{{- list "noTrainingStep" | toJson }}
{{- end }}

{{/* The enabled alerts whose scrape the values leave out, as JSON {"operator": [names], "trainer": [names]}. */}}
{{- define "llmop.blindAlerts" -}}
{{- $rule := .Values.prometheusRule }}
{{- $m := .Values.metrics }}
{{- $trainerKeys := include "llmop.trainerAlerts" . | fromJsonArray }}
{{- $operatorScraped := or (and $m.serviceMonitor.enabled $m.service.enabled) $rule.operatorSelector }}
{{- $blind := dict "operator" (list) "trainer" (list) }}
{{- if $rule.enabled }}
{{- range $key, $alert := $rule.alerts }}
{{- if $alert.enabled }}
{{- $name := printf "LLMJob%s" (title $key) }}
{{- if has $key $trainerKeys }}
{{- if not $m.trainerPodMonitor.enabled }}{{ $_ := set $blind "trainer" (append $blind.trainer $name) }}{{ end }}
{{- else if not $operatorScraped }}
{{- $_ := set $blind "operator" (append $blind.operator $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- toJson $blind }}
{{- end }}
