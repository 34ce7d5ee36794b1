{{- define "flotilla.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* "flotilla.name" (dict "root" $ "component" "operator") -> <fullname>-operator */}}
{{- define "flotilla.name" -}}
{{- printf "%s-%s" (include "flotilla.fullname" .root) .component -}}
{{- end -}}

{{- define "flotilla.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "flotilla.labels" -}}
{{ include "flotilla.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: flotilla
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "flotilla.image" -}}
{{- $tag := .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- with .root.Values.image.registry -}}{{ trimSuffix "/" . }}/{{- end -}}
{{ .image.repository }}:{{ $tag }}
{{- end -}}

{{- define "flotilla.tokensSecret" -}}
{{- .Values.apiTokens.existingSecret | default (include "flotilla.name" (dict "root" . "component" "tokens")) -}}
{{- end -}}

{{- define "flotilla.controllerURL" -}}
{{ include "flotilla.controllerScheme" . }}://{{ include "flotilla.name" (dict "root" . "component" "controller") }}.{{ .Release.Namespace }}.svc:{{ .Values.controller.service.port }}
{{- end -}}

{{/* The controller's port: https with controller.tls.enabled (the port's name says so too, for meshes). */}}
{{- define "flotilla.controllerScheme" -}}
{{- if .Values.controller.tls.enabled -}}https{{- else -}}http{{- end -}}
{{- end -}}

{{- define "flotilla.tlsSecret" -}}
{{- .Values.controller.tls.existingSecret | default (include "flotilla.name" (dict "root" . "component" "controller-tls")) -}}
{{- end -}}

{{- define "flotilla.tokenReviewIngest" -}}
{{- if eq .Values.controller.ingestAuth "tokenreview" -}}true{{- end -}}
{{- end -}}

{{/* The agents' ServiceAccount as the controller's --agent-service-accounts names it. */}}
{{- define "flotilla.agentServiceAccount" -}}
{{ .Release.Namespace }}/{{ include "flotilla.name" (dict "root" . "component" "agent") }}
{{- end -}}

{{/* Env var REDIS_URL from the value or the named Secret; nothing when Redis is not configured. */}}
{{- define "flotilla.redisEnv" -}}
{{- if .Values.redis.existingSecret -}}
- name: REDIS_URL
  valueFrom:
    secretKeyRef: {name: {{ .Values.redis.existingSecret }}, key: {{ .Values.redis.existingSecretKey }}}
{{- else if .Values.redis.url -}}
- name: REDIS_URL
  value: {{ .Values.redis.url | quote }}
{{- end }}
{{- end -}}

{{- define "flotilla.redisEnabled" -}}
{{- if or .Values.redis.url .Values.redis.existingSecret -}}true{{- end -}}
{{- end -}}

{{- define "flotilla.externalDatabase" -}}
{{- if or .Values.controller.database.url .Values.controller.database.existingSecret -}}true{{- end -}}
{{- end -}}

{{/* Checks across values that the JSON schema cannot say clearly. */}}
{{- define "flotilla.validate" -}}
{{- $op := .Values.operator -}}
{{- if and $op.enabled (gt (int $op.replicas) 1) (not $op.leaderElection.enabled) -}}
{{- fail "operator.replicas > 1 needs operator.leaderElection.enabled=true: without it every replica would act" -}}
{{- end -}}
{{- if and .Values.agent.enabled (not .Values.controller.enabled) (not (include "flotilla.redisEnabled" .)) -}}
{{- fail "agent.enabled needs controller.enabled or redis.url/redis.existingSecret: the agents have nowhere to publish" -}}
{{- end -}}
{{- if and .Values.controller.statsPosters (ne .Values.controller.ingestAuth "tokenreview") -}}
{{- fail "controller.statsPosters needs controller.ingestAuth=tokenreview: with shared ingest auth any agent token may post statistics" -}}
{{- end -}}
{{- if and .Values.controller.tokenReview.enabled (not .Values.controller.tokenReview.admins) -}}
{{- fail "controller.tokenReview.enabled needs controller.tokenReview.admins (usernames that get the admin role)" -}}
{{- end -}}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.controller.enabled) (not (include "flotilla.operatorMetrics" .)) -}}
{{- fail "metrics.serviceMonitor.enabled needs controller.enabled or operator.metricsPort: nothing else serves /metrics" -}}
{{- end -}}
{{- end -}}

{{/* "true" when the operator serves its /metrics. */}}
{{- define "flotilla.operatorMetrics" -}}
{{- if and .Values.operator.enabled (gt (int .Values.operator.metricsPort) 0) -}}true{{- end -}}
{{- end -}}
