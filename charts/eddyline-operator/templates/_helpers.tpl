{{/* The release's full name, a DNS label. */}}
{{- define "eddyline-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "eddyline-operator.labels" -}}
app.kubernetes.io/name: eddyline-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "eddyline-operator.selectorLabels" -}}
app.kubernetes.io/name: eddyline-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "eddyline-operator.serviceAccountName" -}}
{{- default (include "eddyline-operator.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "eddyline-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The image StreamApp pods (and restore Jobs) run when the app names none: the operator's
EDDYLINE_RUNTIME_IMAGE and the restore-executor policy's default image. */}}
{{- define "eddyline-operator.runtimeImage" -}}
{{- default (include "eddyline-operator.image" .) .Values.runtimeImage -}}
{{- end -}}

{{/* The namespaces watched when not cluster-wide: the list, or the release namespace. */}}
{{- define "eddyline-operator.namespaces" -}}
{{- if .Values.watchNamespaces -}}
{{- join "," .Values.watchNamespaces -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* What the operator does inside a namespace it watches (least privilege). */}}
{{- define "eddyline-operator.namespacedRules" -}}
- apiGroups: ["eddyline.dev"]
  resources: ["streamapps"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["eddyline.dev"]
  resources: ["streamapps/status"]
  verbs: ["get", "patch", "update"]
# spec.autoscaling: the autoscaler sets replicas through the scale subresource.
- apiGroups: ["eddyline.dev"]
  resources: ["streamapps/scale"]
  verbs: ["get", "patch", "update"]
- apiGroups: [""]
  resources: ["configmaps", "services", "serviceaccounts", "persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete", "deletecollection"]
# Pods are made by StatefulSets and Jobs; the operator only restarts them.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "delete"]
# Restore Jobs with a k8s:// Spark master get the executor ClusterRole through a RoleBinding:
# the operator may bind that one ClusterRole, instead of holding pod creation itself.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["clusterroles"]
  verbs: ["bind"]
  resourceNames: [{{ printf "%s-restore-executor" (include "eddyline-operator.fullname" .) | quote }}]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
# list: the StatefulSet controller's FailedCreate Events say why pods are missing.
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch", "list"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
# kopf's peering (leader election between replicas): read the peers, write its keep-alive.
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end -}}
